// LtMatmul (runtime/cuda/blas_lt.h): Blas::gemmFused through cuBLASLt.
#include "runtime/cuda/blas_lt.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "runtime/cuda/cublaslt_library.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {
namespace {

// The most workspace an algorithm may ask for: what NVIDIA recommends for Hopper, and what llm.c
// gives it. Allocated only as far as the chosen algorithms need.
constexpr size_t kMaxWorkspaceBytes = size_t{32} << 20;

[[noreturn]] void throwLtError(const CublasLtLibrary& lt, cublasStatus_t status, const char* call, const char* file,
                               int line) {
  throwBlasError("cuBLASLt", lt.getStatusName(status), lt.getStatusString(status), status, call, file, line);
}

#define COHORT_CUBLASLT_CHECK(lt, expr)                                                                   \
  do {                                                                                                    \
    cublasStatus_t cohort_lt_status_ = (expr);                                                            \
    if (__builtin_expect(cohort_lt_status_ != CUBLAS_STATUS_SUCCESS, 0)) {                                \
      throwLtError((lt), cohort_lt_status_, #expr, __FILE__, __LINE__);                                   \
    }                                                                                                     \
  } while (0)

// The largest power of two up to 256 that divides the address (cuBLASLt's own bound).
int alignmentOf(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  return address == 0 ? 256 : static_cast<int>(std::min<uintptr_t>(256, address & (~address + 1)));
}

cublasLtEpilogue_t ltEpilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kBiasGelu:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kGeluGrad:
      return CUBLASLT_EPILOGUE_DGELU;
  }
  COHORT_CHECK(false) << "unknown epilogue";
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// One call's descriptors, destroyed with it. Row-major C[m, n] is column-major Cᵀ[n, m], computed as
// op(B)ᵀ · op(A)ᵀ (Blas::gemm's swap): cuBLASLt's A is B's memory, its B is A's, its D has n rows, so
// the bias (one per row of D) is one per column of C, and the aux matrix has C's layout.
struct Descriptors {
  const CublasLtLibrary& lt;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;

  Descriptors(const CublasLtLibrary& library, const FusedGemm& g, const EpilogueOperands& x) : lt(library) {
    const GemmOptions& o = g.options;
    const cudaDataType type = g.type == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute =
        g.type == DType::kF32 && g.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    COHORT_CUBLASLT_CHECK(lt, lt.matmulDescCreate(&op, compute, CUDA_R_32F));
    const int32_t transA = o.transB ? CUBLAS_OP_T : CUBLAS_OP_N, transB = o.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    const uint32_t epilogue = ltEpilogue(g.epilogue);
    set(CUBLASLT_MATMUL_DESC_TRANSA, &transA, sizeof transA);
    set(CUBLASLT_MATMUL_DESC_TRANSB, &transB, sizeof transB);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
    if (g.epilogue != GemmEpilogue::kGeluGrad) {
      const int32_t biasType = type;
      set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &x.bias, sizeof x.bias);
      set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &biasType, sizeof biasType);
    }
    if (g.epilogue != GemmEpilogue::kBias) {
      const int64_t auxLd = o.n;
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &x.aux, sizeof x.aux);
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxLd, sizeof auxLd);
    }
    COHORT_CUBLASLT_CHECK(lt, lt.matrixLayoutCreate(&a, type, o.transB ? o.k : o.n, o.transB ? o.n : o.k,
                                                    o.transB ? o.k : o.n));
    COHORT_CUBLASLT_CHECK(lt, lt.matrixLayoutCreate(&b, type, o.transA ? o.m : o.k, o.transA ? o.k : o.m,
                                                    o.transA ? o.m : o.k));
    COHORT_CUBLASLT_CHECK(lt, lt.matrixLayoutCreate(&d, type, o.n, o.m, o.n));
  }

  ~Descriptors() {
    if (preference) lt.matmulPreferenceDestroy(preference);
    for (cublasLtMatrixLayout_t l : {a, b, d}) {
      if (l) lt.matrixLayoutDestroy(l);
    }
    if (op) lt.matmulDescDestroy(op);
  }

  void set(cublasLtMatmulDescAttributes_t attribute, const void* value, size_t bytes) {
    COHORT_CUBLASLT_CHECK(lt, lt.matmulDescSetAttribute(op, attribute, value, bytes));
  }

  // The heuristic's first algorithm for operands of these alignments (A and B as cuBLASLt names
  // them), or none.
  cublasStatus_t ask(cublasLtHandle_t handle, uint32_t alignA, uint32_t alignB, uint32_t alignD,
                     cublasLtMatmulHeuristicResult_t* result, int* found) {
    COHORT_CUBLASLT_CHECK(lt, lt.matmulPreferenceCreate(&preference));
    const uint64_t workspace = kMaxWorkspaceBytes;
    COHORT_CUBLASLT_CHECK(lt, lt.matmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                              &workspace, sizeof workspace));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignA},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignB},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignD},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignD}};
    for (const auto& [attribute, bytes] : alignments) {
      COHORT_CUBLASLT_CHECK(lt, lt.matmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof bytes));
    }
    return lt.matmulAlgoGetHeuristic(handle, op, a, b, d, d, preference, 1, result, found);
  }
};

}  // namespace

void throwBlasError(const char* library, const char* name, const char* description, cublasStatus_t status,
                    const char* call, const char* file, int line) {
  cudaGetLastError();  // a failed launch inside the library must not be reported again by the next check
  std::ostringstream os;
  os << library << " error " << name << " (" << description << ") from " << call << " at " << file << ":" << line;
  if (status == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemory(os.str());
  throw Error(os.str());
}

LtMatmul::LtMatmul(const Stream& stream) : stream_(stream), lt_(std::make_unique<const CublasLtLibrary>()) {
  COHORT_CUBLASLT_CHECK(*lt_, lt_->create(&handle_));
}

LtMatmul::~LtMatmul() {
  // Called by ~Blas with the device current; a destructor must not throw, so failures are ignored.
  if (workspace_) cudaFree(workspace_);
  lt_->destroy(handle_);
}

void LtMatmul::reserveWorkspace(size_t bytes) {
  if (bytes <= workspaceBytes_) return;
  // Only while the first steps find their algorithms: cudaFree waits for the work using the old one.
  if (workspace_) COHORT_CUDA_CHECK(cudaFree(workspace_));
  workspace_ = nullptr, workspaceBytes_ = 0;
  COHORT_CUDA_CHECK(cudaMalloc(&workspace_, bytes));
  workspaceBytes_ = bytes;
}

bool LtMatmul::run(const FusedGemm& g, const void* a, const void* b, void* c, const EpilogueOperands& x) {
  const GemmOptions& o = g.options;
  Descriptors descriptors(*lt_, g, x);
  const Key key{o.m, o.n, o.k, o.transA, o.transB, static_cast<int>(g.epilogue), static_cast<int>(g.type), g.tf32,
                alignmentOf(a), alignmentOf(b), alignmentOf(c), alignmentOf(x.bias), alignmentOf(x.aux)};
  auto it = choices_.find(key);
  if (it == choices_.end()) {
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = descriptors.ask(handle_, alignmentOf(b), alignmentOf(a), alignmentOf(c), &result, &found);
    if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) {
      throwLtError(*lt_, status, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
    }
    Choice choice;
    choice.supported = status == CUBLAS_STATUS_SUCCESS && found > 0;
    if (choice.supported) choice.algo = result.algo, choice.workspaceBytes = result.workspaceSize;
    it = choices_.emplace(key, choice).first;
  }
  if (!it->second.supported) return false;
  reserveWorkspace(it->second.workspaceBytes);
  const float alpha = o.alpha, beta = 0.0f;
  COHORT_CUBLASLT_CHECK(*lt_, lt_->matmul(handle_, descriptors.op, &alpha, b, descriptors.a, a, descriptors.b, &beta, c,
                                          descriptors.d, c, descriptors.d, &it->second.algo, workspace_,
                                          workspaceBytes_, static_cast<cudaStream_t>(stream_.native())));
  return true;
}

}  // namespace cohort::runtime::cuda
