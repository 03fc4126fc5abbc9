// cudasim's cuBLASLt algorithms (cudasim/cublaslt_algorithms.h) as a caller sees them: the heuristic
// offers the modelled algorithms in its order within the preference's workspace limit and promised
// alignments; cublasLtMatmul refuses an algorithm whose alignment or workspace the call does not
// meet; the bias-gradient epilogues BGRADA and BGRADB write the sums over k of op(A)'s rows and
// op(B)'s columns. Small integer data: every sum is exact.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cublasLt.h"
#include "cudasim/cublaslt_algorithms.h"

namespace {

using Floats = std::vector<float>;

struct Device {
  float* p = nullptr;
  explicit Device(const Floats& v) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), v.size() * sizeof(float) + 64), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Device() { cudaFree(p); }
  Floats get(size_t n) const {
    Floats v(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

// D (m x n, column-major) = A (m x k) · B (k x n), fp32, no transposes.
class Product {
 public:
  Product(int m, int n, int k, uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT, const void* bias = nullptr) {
    EXPECT_EQ(cublasLtCreate(&handle), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
              CUBLAS_STATUS_SUCCESS);
    if (bias) {
      EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
                CUBLAS_STATUS_SUCCESS);
    }
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, m, k, m), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&b, CUDA_R_32F, k, n, k), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, m, n, m), CUBLAS_STATUS_SUCCESS);
  }
  ~Product() {
    cublasLtMatrixLayoutDestroy(a), cublasLtMatrixLayoutDestroy(b), cublasLtMatrixLayoutDestroy(d);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(handle);
  }
  // The ids the heuristic offers with this workspace limit and alignment promised of every matrix.
  std::vector<int> offered(uint64_t workspace, uint32_t alignment, std::vector<cublasLtMatmulHeuristicResult_t>* out) {
    cublasLtMatmulPreference_t pref = nullptr;
    EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                   sizeof workspace),
              CUBLAS_STATUS_SUCCESS);
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, attr, &alignment, sizeof alignment), CUBLAS_STATUS_SUCCESS);
    }
    out->assign(8, {});
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(handle, op, a, b, d, d, pref, 8, out->data(), &found);
    cublasLtMatmulPreferenceDestroy(pref);
    out->resize(static_cast<size_t>(found));
    std::vector<int> ids;
    for (const auto& r : *out) {
      int32_t id = -1;
      EXPECT_EQ(cublasLtMatmulAlgoConfigGetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, nullptr),
                CUBLAS_STATUS_SUCCESS);
      ids.push_back(id);
    }
    return ids;
  }
  cublasStatus_t run(const float* pa, const float* pb, float* pd, const cublasLtMatmulAlgo_t* algo, void* ws,
                     size_t wsBytes) {
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(handle, op, &one, pa, a, pb, b, &zero, pd, d, pd, d, algo, ws, wsBytes, nullptr);
  }

  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
};

TEST(CudasimCublasLt, TheHeuristicOffersTheModelledAlgorithmsThatFit) {
  Product p(64, 64, 256);
  std::vector<cublasLtMatmulHeuristicResult_t> results;
  EXPECT_EQ(p.offered(64 << 20, 256, &results), (std::vector<int>{1, 2, 5, 3, 4, 0}));
  EXPECT_EQ(results[2].workspaceSize, size_t{64} * 64 * 2 * sizeof(float));
  EXPECT_EQ(p.offered(0, 256, &results), (std::vector<int>{1, 2, 3, 0}));  // no split-K without workspace
  EXPECT_EQ(p.offered(0, 4, &results), (std::vector<int>{0}));             // 4-byte operands: SIMT only
}

TEST(CudasimCublasLt, MatmulRefusesAnAlgorithmTheCallDoesNotFit) {
  const int m = 16, n = 16, k = 16;
  Floats ones(m * k + 4, 1.0f);
  Device da(ones), db(ones), dd(Floats(m * n + 4, 0.0f)), ws(Floats(m * n * 4, 0.0f));
  Product p(m, n, k);
  std::vector<cublasLtMatmulHeuristicResult_t> results;
  const std::vector<int> ids = p.offered(1 << 20, 256, &results);
  ASSERT_EQ(ids[0], 1);
  EXPECT_EQ(p.run(da.p + 1, db.p, dd.p, &results[0].algo, nullptr, 0), CUBLAS_STATUS_NOT_SUPPORTED);  // A misaligned
  const size_t splitK4 = 4;
  ASSERT_EQ(ids[splitK4], 4);
  EXPECT_EQ(p.run(da.p, db.p, dd.p, &results[splitK4].algo, ws.p, 1024), CUBLAS_STATUS_NOT_SUPPORTED);  // short
  EXPECT_EQ(p.run(da.p, db.p, dd.p, &results[splitK4].algo, ws.p, results[splitK4].workspaceSize),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(dd.get(m * n), Floats(m * n, static_cast<float>(k)));
  EXPECT_EQ(p.run(da.p + 1, db.p, dd.p, nullptr, nullptr, 0), CUBLAS_STATUS_SUCCESS);  // the heuristic's fit: SIMT
}

TEST(CudasimCublasLt, BiasGradientEpiloguesSumOverK) {
  const int m = 8, n = 12, k = 16;
  Floats a(m * k), b(k * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
  Floats rowsOfA(m, 0.0f), colsOfB(n, 0.0f);
  for (int i = 0; i < m; ++i) {
    for (int l = 0; l < k; ++l) rowsOfA[i] += a[i + l * m];
  }
  for (int j = 0; j < n; ++j) {
    for (int l = 0; l < k; ++l) colsOfB[j] += b[l + j * k];
  }
  Device da(a), db(b), dd(Floats(m * n, 0.0f)), dbias(Floats(n, 99.0f));
  for (auto [epilogue, want] : {std::pair{CUBLASLT_EPILOGUE_BGRADA, rowsOfA}, std::pair{CUBLASLT_EPILOGUE_BGRADB, colsOfB}}) {
    Product p(m, n, k, epilogue, dbias.p);
    ASSERT_EQ(p.run(da.p, db.p, dd.p, nullptr, nullptr, 0), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(dbias.get(want.size()), want) << "epilogue " << epilogue;
  }
}

}  // namespace
