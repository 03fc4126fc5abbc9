// cuBLASLt as cudasim emulates it (include/cublasLt.h): handles, descriptors on the host, the
// heuristic, and one matrix product with its epilogue as an operation of the given stream. The
// product is cublas.cc's (cublas_gemm.h): fp32 sums on oneDNN's sgemm, bf16 inputs widened exactly;
// the epilogue runs on its fp32 result, which is rounded once as it is stored.
//
// The checks are the real library's where Cohort could trip them (dimensions, leading dimensions,
// types, the aux leading dimension's multiple of 8, the bias and aux pointers an epilogue needs, an
// algorithm's alignment and workspace), and, beyond them, that every operand lies inside one live
// device allocation. The algorithms and their made-up times are cublaslt_algorithms.h's.
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
#include "cudasim/cublaslt_algorithms.h"
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

// What the caller allows the heuristic: workspace (the real default is none) and the alignments it
// promises of A, B, C and D (the real default: 256 bytes).
struct Preference {
  uint64_t maxWorkspace = 0;
  uint32_t alignment[4] = {256, 256, 256, 256};
};

// Marks an algorithm the heuristic filled in (its data[1]); data[0] is the algorithm's id.
constexpr uint64_t kAlgoMark = 0x636f686f72744c74;

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

bool biasGradient(uint32_t epilogue) {
  return epilogue == CUBLASLT_EPILOGUE_BGRADA || epilogue == CUBLASLT_EPILOGUE_BGRADB;
}

bool supportedEpilogue(const MatmulDesc& desc, const Layout& d) {
  const bool needsBias = desc.epilogue == CUBLASLT_EPILOGUE_BIAS ||
                         desc.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || biasGradient(desc.epilogue);
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

// BGRADA: Σ_k op(A)[i, k] for each row i of D; BGRADB: Σ_k op(B)[k, j] for each column j. The
// inputs widened, summed in fp32 in k order, stored in D's type.
void biasGradientOf(const LtGemm& op) {
  const Gemm& g = op.gemm;
  const bool ofA = op.epilogue == CUBLASLT_EPILOGUE_BGRADA;
  const int64_t count = ofA ? g.m : g.n;
  for (int64_t i = 0; i < count; ++i) {
    float sum = 0.0f;
    for (int64_t k = 0; k < g.k; ++k) {
      const bool trans = ofA ? g.transA : g.transB;
      const int64_t ld = ofA ? g.lda : g.ldb;
      // op(A)[i, k] is A[k, i] when transposed; op(B)[k, j] is B[j, k] (column-major).
      const int64_t at = ofA ? (trans ? k + i * ld : i + k * ld) : (trans ? i + k * ld : k + i * ld);
      sum += load(ofA ? g.a : g.b, g.bf16, at);
    }
    store(const_cast<void*>(op.bias), op.d == CUDA_R_16BF, i, sum);
  }
}

// The product in fp32 (C widened where beta reads it), then the epilogue per element, then D.
void runLtGemm(const LtGemm& op) {
  const Gemm& g = op.gemm;
  const bool bf16 = op.d == CUDA_R_16BF;
  if (biasGradient(op.epilogue)) biasGradientOf(op);
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
  const bool readsBias = op.epilogue == CUBLASLT_EPILOGUE_BIAS || op.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                         op.epilogue == CUBLASLT_EPILOGUE_BGRADA;
  const int64_t biasLength = op.epilogue == CUBLASLT_EPILOGUE_BGRADB ? g.n : g.m;
  const bool usesAux = op.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || op.epilogue == CUBLASLT_EPILOGUE_DGELU;
  return (!readsAB || (onDevice(g.a, spanBytes(a.rows, a.cols, a.ld, ab)) &&
                       onDevice(g.b, spanBytes(b.rows, b.cols, b.ld, ab)))) &&
         (g.beta.knownZero() || onDevice(g.c, spanBytes(g.m, g.n, g.ldc, d))) &&
         onDevice(op.out, spanBytes(g.m, g.n, op.ldd, d)) && (!(readsBias || biasGradient(op.epilogue)) || onDevice(op.bias, biasLength * d)) &&
         (!usesAux || onDevice(op.aux, spanBytes(g.m, g.n, op.auxLd, d)));
}

// Whether `algo` may run on matrices of these layouts given these alignments (bytes) of A, B, C, D.
bool alignmentsFit(const lt::Algo& algo, const Layout* const (&layouts)[4], const uint32_t (&alignment)[4]) {
  for (int i = 0; i < 4; ++i) {
    const size_t element = elementBytes(layouts[i]->type);
    const uint32_t need = lt::alignmentNeeded(algo, element);
    if (alignment[i] < need || (static_cast<size_t>(layouts[i]->ld) * element) % need != 0) return false;
  }
  return true;
}

lt::ProductSizes sizesOf(const LtGemm& op, const Layout& a) {
  return {.m = op.gemm.m, .n = op.gemm.n, .k = op.gemm.k, .elementBytes = elementBytes(a.type)};
}

// The largest power of two up to 256 that divides the address (the real library's notion).
uint32_t alignmentOf(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  return address == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(256, address & (~address + 1)));
}

// The algorithm cublasLtMatmul runs: `given` (NOT_SUPPORTED when the call's pointers, leading
// dimensions or workspace do not meet its needs), or without one the heuristic's first that fits.
cublasStatus_t algorithmFor(const cublasLtMatmulAlgo_t* given, const LtGemm& op,
                            const Layout* const (&layouts)[4], size_t workspace, const lt::Algo** out) {
  const uint32_t actual[4] = {alignmentOf(op.gemm.a), alignmentOf(op.gemm.b), alignmentOf(op.gemm.c),
                              alignmentOf(op.out)};
  const lt::ProductSizes sizes = sizesOf(op, *layouts[0]);
  auto fits = [&](const lt::Algo& a) {
    return alignmentsFit(a, layouts, actual) && lt::workspaceBytes(a, sizes) <= workspace;
  };
  if (given) {
    const lt::Algo* a = given->data[1] == kAlgoMark ? lt::algoById(static_cast<int>(given->data[0])) : nullptr;
    if (!a) return CUBLAS_STATUS_INVALID_VALUE;
    *out = a;
    return fits(*a) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
  }
  for (int i = 0; i < lt::kAlgoCount; ++i) {
    const lt::Algo* a = lt::algoById(lt::heuristicOrder()[i]);
    if (fits(*a)) {
      *out = a;
      return CUBLAS_STATUS_SUCCESS;
    }
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
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

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  return createState(pref, Preference{});
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t sizeInBytes) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  Preference& p = *stateOf<Preference>(pref);
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return setValue(&p.maxWorkspace, buf, sizeInBytes) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
      const int i = attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
      return setValue(&p.alignment[i], buf, sizeInBytes) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    }
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
  const Layout* const layouts[4] = {stateOf<Layout>(Adesc), stateOf<Layout>(Bdesc), stateOf<Layout>(Cdesc),
                                    stateOf<Layout>(Ddesc)};
  const cublasStatus_t s =
      plan(*stateOf<MatmulDesc>(operationDesc), *layouts[0], *layouts[1], *layouts[2], *layouts[3], &op);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const Preference& p = *stateOf<Preference>(preference);
  const lt::ProductSizes sizes = sizesOf(op, *layouts[0]);
  int found = 0;
  for (int i = 0; i < lt::kAlgoCount && found < requestedAlgoCount; ++i) {
    const lt::Algo& a = *lt::algoById(lt::heuristicOrder()[i]);
    const size_t workspace = lt::workspaceBytes(a, sizes);
    if (!alignmentsFit(a, layouts, p.alignment) || workspace > p.maxWorkspace) continue;
    cublasLtMatmulHeuristicResult_t& r = heuristicResultsArray[found++];
    r = {};
    r.algo.data[0] = static_cast<uint64_t>(a.id);
    r.algo.data[1] = kAlgoMark;
    r.workspaceSize = workspace;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
  }
  *returnAlgoCount = found;
  return found > 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
                                                    size_t sizeInBytes, size_t* sizeWritten) {
  const lt::Algo* a = algo && algo->data[1] == kAlgoMark ? lt::algoById(static_cast<int>(algo->data[0])) : nullptr;
  if (!a || !buf) return CUBLAS_STATUS_INVALID_VALUE;
  if (attr == CUBLASLT_ALGO_CONFIG_ID && sizeInBytes == sizeof(int32_t)) {
    const int32_t id = a->id;
    std::memcpy(buf, &id, sizeof id);
  } else if (attr == CUBLASLT_ALGO_CONFIG_SPLITK_NUM && sizeInBytes == sizeof(uint32_t)) {
    const uint32_t splitK = static_cast<uint32_t>(a->splitK);
    std::memcpy(buf, &splitK, sizeof splitK);
  } else {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (sizeWritten) *sizeWritten = sizeInBytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream) {
  if (!liveOnCurrentDevice(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!computeDesc || !Adesc || !Bdesc || !Cdesc || !Ddesc || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  const Layout &a = *stateOf<Layout>(Adesc), &b = *stateOf<Layout>(Bdesc);
  const Layout* const layouts[4] = {&a, &b, stateOf<Layout>(Cdesc), stateOf<Layout>(Ddesc)};
  LtGemm op;
  const cublasStatus_t s = plan(*stateOf<MatmulDesc>(computeDesc), a, b, *layouts[2], *layouts[3], &op);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  op.gemm.alpha.value = *static_cast<const float*>(alpha);
  op.gemm.beta.value = *static_cast<const float*>(beta);
  op.gemm.a = A, op.gemm.b = B, op.gemm.c = const_cast<void*>(C), op.out = D;
  if (op.gemm.m == 0 || op.gemm.n == 0) return CUBLAS_STATUS_SUCCESS;
  const lt::Algo* chosen = nullptr;
  if (cublasStatus_t fit = algorithmFor(algo, op, layouts, workspace ? workspaceSizeInBytes : 0, &chosen);
      fit != CUBLAS_STATUS_SUCCESS) {
    return fit;
  }
  const size_t needed = lt::workspaceBytes(*chosen, sizesOf(op, a));
  if (!operandsOnDevice(op, a, b) || (needed > 0 && !onDevice(workspace, needed))) return CUBLAS_STATUS_INVALID_VALUE;
  return enqueue(stream, [op] { runLtGemm(op); }) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                                  : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // extern "C"
