// cuBLASLt as cudasim emulates it (include/cublasLt.h): handles, descriptors on the host, the
// heuristic, and one matrix product with its epilogue as an operation of the given stream. The
// product is cublas.cc's (cublas_gemm.h): fp32 sums on oneDNN's sgemm, bf16 inputs widened exactly;
// the epilogue runs on its fp32 result, which is rounded once as it is stored.
//
// The checks are the real library's where Cohort could trip them (dimensions, leading dimensions,
// types, the aux leading dimension's multiple of 8, the bias and aux pointers an epilogue needs),
// and, beyond them, that every operand lies inside one live device allocation.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <set>
#include <vector>

#include "cublasLt.h"
#include "cublas_gemm.h"
#include "cuda_bf16.h"
#include "cudasim/sim.h"

struct cublasLtContext {
  int device = 0;  // current when the handle was made; it must be current at each matmul
};

namespace cudasim {
namespace {

struct LtHandles {
  std::mutex m;
  std::set<cublasLtContext*> live;
};

LtHandles& ltHandles() {
  static LtHandles* h = new LtHandles;  // never destroyed: stream threads may outlive static destruction
  return *h;
}

bool liveOnCurrentDevice(cublasLtHandle_t handle) {
  LtHandles& h = ltHandles();
  std::lock_guard lock(h.m);
  if (!h.live.count(handle)) return false;
  int device = -1;
  return cudaGetDevice(&device) == cudaSuccess && device == handle->device;
}

struct MatmulDesc {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType scale = CUDA_R_32F;
  int32_t pointerMode = 0;  // host
  int32_t transA = CUBLAS_OP_N, transB = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t auxLd = 0;
  int32_t biasType = -1;  // D's type
};

struct Layout {
  cudaDataType type = CUDA_R_32F;
  int64_t rows = 0, cols = 0, ld = 0;
};

// The descriptors' state lives in the opaque structs' own storage, as in the real library.
template <class State, class Opaque>
State* stateOf(Opaque* opaque) {
  static_assert(sizeof(State) <= sizeof(opaque->data) && alignof(State) <= alignof(uint64_t));
  return std::launder(reinterpret_cast<State*>(opaque->data));
}

template <class State, class Opaque>
cublasStatus_t createState(Opaque** out, const State& initial) {
  if (!out) return CUBLAS_STATUS_INVALID_VALUE;
  auto* opaque = new Opaque{};
  new (opaque->data) State(initial);
  *out = opaque;
  return CUBLAS_STATUS_SUCCESS;
}

template <class T>
bool setValue(T* field, const void* buf, size_t size) {
  if (!buf || size != sizeof(T)) return false;
  std::memcpy(field, buf, sizeof(T));
  return true;
}

// One product with its epilogue, checked: D (m x n) = alpha · op(A) (m x k) · op(B) (k x n) + beta · C.
struct LtGemm {
  Gemm gemm;
  cudaDataType d = CUDA_R_32F;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;
  int64_t auxLd = 0;
  void* out = nullptr;
  int ldd = 0;
};

bool validOp(int32_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

bool supportedEpilogue(const MatmulDesc& desc, const Layout& d) {
  const bool needsBias = desc.epilogue == CUBLASLT_EPILOGUE_BIAS || desc.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool needsAux = desc.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || desc.epilogue == CUBLASLT_EPILOGUE_DGELU;
  if (desc.epilogue != CUBLASLT_EPILOGUE_DEFAULT && !needsBias && !needsAux) return false;
  if (needsBias && (!desc.bias || (desc.biasType != -1 && desc.biasType != d.type))) return false;
  return !needsAux || (desc.aux && desc.auxLd % 8 == 0 && desc.auxLd >= std::max<int64_t>(1, d.rows));
}

// INVALID_VALUE for shapes that do not fit; NOT_SUPPORTED for a valid request the emulation (and,
// for the aux rule, the real library) has no algorithm for.
cublasStatus_t plan(const MatmulDesc& desc, const Layout& a, const Layout& b, const Layout& c, const Layout& d,
                    LtGemm* out) {
  if (!validOp(desc.transA) || !validOp(desc.transB)) return CUBLAS_STATUS_INVALID_VALUE;
  const bool transA = desc.transA != CUBLAS_OP_N, transB = desc.transB != CUBLAS_OP_N;
  const int64_t m = d.rows, n = d.cols, k = transA ? a.rows : a.cols;
  if ((transA ? a.cols : a.rows) != m || (transB ? b.cols : b.rows) != k || (transB ? b.rows : b.cols) != n ||
      c.rows != m || c.cols != n || c.ld != d.ld) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  for (const Layout* l : {&a, &b, &c, &d}) {
    if (l->ld < std::max<int64_t>(1, l->rows)) return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool bf16 = a.type == CUDA_R_16BF;
  const bool typesFit = a.type == b.type && c.type == d.type && (a.type == CUDA_R_32F || bf16) &&
                        (d.type == CUDA_R_32F || (bf16 && d.type == CUDA_R_16BF));
  const bool computeFits = desc.scale == CUDA_R_32F && desc.pointerMode == 0 &&
                           (desc.compute == CUBLAS_COMPUTE_32F || desc.compute == CUBLAS_COMPUTE_32F_PEDANTIC ||
                            (desc.compute == CUBLAS_COMPUTE_32F_FAST_TF32 && !bf16));
  if (!typesFit || !computeFits || !supportedEpilogue(desc, d)) return CUBLAS_STATUS_NOT_SUPPORTED;
  out->gemm = {.transA = transA, .transB = transB, .tf32 = desc.compute == CUBLAS_COMPUTE_32F_FAST_TF32,
               .bf16 = bf16, .bf16C = d.type == CUDA_R_16BF, .m = static_cast<int>(m), .n = static_cast<int>(n),
               .k = static_cast<int>(k), .alpha = {}, .beta = {}, .a = nullptr, .b = nullptr, .c = nullptr,
               .lda = static_cast<int>(a.ld), .ldb = static_cast<int>(b.ld), .ldc = static_cast<int>(c.ld)};
  out->d = d.type;
  out->epilogue = desc.epilogue;
  out->bias = desc.bias;
  out->aux = desc.aux;
  out->auxLd = desc.auxLd;
  out->ldd = static_cast<int>(d.ld);
  return CUBLAS_STATUS_SUCCESS;
}

// GPT-2's GELU, the tanh approximation, and its derivative.
constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;
float gelu(float v) { return 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + kCubic * v * v * v))); }
float geluGrad(float v) {
  const float t = std::tanh(kSqrt2OverPi * (v + kCubic * v * v * v));
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);
}

float load(const void* p, bool bf16, int64_t at) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[at]) : static_cast<const float*>(p)[at];
}
void store(void* p, bool bf16, int64_t at, float v) {
  if (bf16) {
    static_cast<__nv_bfloat16*>(p)[at] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(p)[at] = v;
  }
}

// The product in fp32 (C widened where beta reads it), then the epilogue per element, then D.
void runLtGemm(const LtGemm& op) {
  const Gemm& g = op.gemm;
  const bool bf16 = op.d == CUDA_R_16BF;
  std::vector<float> wide(static_cast<size_t>(g.m) * static_cast<size_t>(g.n), 0.0f);
  if (!g.beta.knownZero()) wide = packed(g.c, bf16, false, g.m, g.n, g.ldc);
  runFloatGemm(g, wide.data(), g.m);
  for (int64_t j = 0; j < g.n; ++j) {
    for (int64_t i = 0; i < g.m; ++i) {
      float v = wide[static_cast<size_t>(i + j * g.m)];
      switch (op.epilogue) {
        case CUBLASLT_EPILOGUE_BIAS:
          v += load(op.bias, bf16, i);
          break;
        case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
          v += load(op.bias, bf16, i);
          store(op.aux, bf16, i + j * op.auxLd, v);
          v = gelu(v);
          break;
        case CUBLASLT_EPILOGUE_DGELU:
          v *= geluGrad(load(op.aux, bf16, i + j * op.auxLd));
          break;
        default:
          break;
      }
      store(op.out, bf16, i + j * op.ldd, v);
    }
  }
}

// Every operand the operation will touch lies inside one live device allocation.
bool operandsOnDevice(const LtGemm& op, const Layout& a, const Layout& b) {
  const Gemm& g = op.gemm;
  const size_t ab = elementBytes(a.type), d = elementBytes(op.d);
  const bool readsAB = g.k > 0 && !g.alpha.knownZero();
  const bool readsBias = op.epilogue == CUBLASLT_EPILOGUE_BIAS || op.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool usesAux = op.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || op.epilogue == CUBLASLT_EPILOGUE_DGELU;
  return (!readsAB || (onDevice(g.a, spanBytes(a.rows, a.cols, a.ld, ab)) &&
                       onDevice(g.b, spanBytes(b.rows, b.cols, b.ld, ab)))) &&
         (g.beta.knownZero() || onDevice(g.c, spanBytes(g.m, g.n, g.ldc, d))) &&
         onDevice(op.out, spanBytes(g.m, g.n, op.ldd, d)) && (!readsBias || onDevice(op.bias, g.m * d)) &&
         (!usesAux || onDevice(op.aux, spanBytes(g.m, g.n, op.auxLd, d)));
}

}  // namespace
}  // namespace cudasim

using namespace cudasim;

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (!lightHandle) return CUBLAS_STATUS_INVALID_VALUE;
  int count = 0, device = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDevice(&device) != cudaSuccess) {
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  auto* context = new cublasLtContext{device};
  LtHandles& h = ltHandles();
  std::lock_guard lock(h.m);
  h.live.insert(context);
  *lightHandle = context;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  LtHandles& h = ltHandles();
  std::lock_guard lock(h.m);
  if (!h.live.erase(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) { return cublasGetStatusName(status); }
const char* cublasLtGetStatusString(cublasStatus_t status) { return cublasGetStatusString(status); }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
  return createState(matmulDesc, MatmulDesc{.compute = computeType, .scale = scaleType});
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  delete matmulDesc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t sizeInBytes) {
  if (!matmulDesc) return CUBLAS_STATUS_INVALID_VALUE;
  MatmulDesc& d = *stateOf<MatmulDesc>(matmulDesc);
  bool ok = false;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: ok = setValue(&d.compute, buf, sizeInBytes); break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: ok = setValue(&d.scale, buf, sizeInBytes); break;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: ok = setValue(&d.pointerMode, buf, sizeInBytes); break;
    case CUBLASLT_MATMUL_DESC_TRANSA: ok = setValue(&d.transA, buf, sizeInBytes); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: ok = setValue(&d.transB, buf, sizeInBytes); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = setValue(&d.epilogue, buf, sizeInBytes); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = setValue(&d.bias, buf, sizeInBytes); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: ok = setValue(&d.aux, buf, sizeInBytes); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: ok = setValue(&d.auxLd, buf, sizeInBytes); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: ok = setValue(&d.biasType, buf, sizeInBytes); break;
  }
  return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (rows > INT32_MAX || cols > INT32_MAX || ld < 0 || ld > INT32_MAX) return CUBLAS_STATUS_INVALID_VALUE;
  return createState(matLayout, Layout{type, static_cast<int64_t>(rows), static_cast<int64_t>(cols), ld});
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  delete matLayout;
  return CUBLAS_STATUS_SUCCESS;
}

// Preferences are accepted and stored nowhere: the one emulated algorithm needs no workspace and
// reads any alignment.
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new cublasLtMatmulPreferenceOpaque_t{};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t sizeInBytes) {
  uint64_t bytes = 0;
  uint32_t alignment = 0;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return pref && setValue(&bytes, buf, sizeInBytes) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return pref && setValue(&alignment, buf, sizeInBytes) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int* returnAlgoCount) {
  if (!liveOnCurrentDevice(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!operationDesc || !Adesc || !Bdesc || !Cdesc || !Ddesc || !preference || requestedAlgoCount < 1 ||
      !heuristicResultsArray || !returnAlgoCount) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *returnAlgoCount = 0;
  LtGemm op;
  const cublasStatus_t s = plan(*stateOf<MatmulDesc>(operationDesc), *stateOf<Layout>(Adesc), *stateOf<Layout>(Bdesc),
                                *stateOf<Layout>(Cdesc), *stateOf<Layout>(Ddesc), &op);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  heuristicResultsArray[0] = {};
  heuristicResultsArray[0].state = CUBLAS_STATUS_SUCCESS;
  heuristicResultsArray[0].wavesCount = 1.0f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream) {
  static_cast<void>(algo), static_cast<void>(workspace), static_cast<void>(workspaceSizeInBytes);
  if (!liveOnCurrentDevice(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!computeDesc || !Adesc || !Bdesc || !Cdesc || !Ddesc || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  const Layout &a = *stateOf<Layout>(Adesc), &b = *stateOf<Layout>(Bdesc);
  LtGemm op;
  const cublasStatus_t s =
      plan(*stateOf<MatmulDesc>(computeDesc), a, b, *stateOf<Layout>(Cdesc), *stateOf<Layout>(Ddesc), &op);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  op.gemm.alpha.value = *static_cast<const float*>(alpha);
  op.gemm.beta.value = *static_cast<const float*>(beta);
  op.gemm.a = A, op.gemm.b = B, op.gemm.c = const_cast<void*>(C), op.out = D;
  if (op.gemm.m == 0 || op.gemm.n == 0) return CUBLAS_STATUS_SUCCESS;
  if (!operandsOnDevice(op, a, b)) return CUBLAS_STATUS_INVALID_VALUE;
  return enqueue(stream, [op] { runLtGemm(op); }) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                                  : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // extern "C"
