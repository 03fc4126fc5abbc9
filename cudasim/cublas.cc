// cuBLAS as cudasim emulates it (include/cublas_v2.h): handles, and GEMM (one, or a strided batch;
// fp32, or bf16 inputs with fp32 accumulation) and SSCAL as operations of the handle's stream,
// following the real argument conventions. A GEMM runs on oneDNN's sgemm (fp32 accumulation, as on
// a GPU), so a result differs from a double-accumulating reference by float rounding only; alpha,
// beta, the widening of bf16 inputs (exact), the rounding of a bf16 output and the TF32 rounding of
// inputs are applied here, around it. Every GEMM is a strided batch: all calls are the same code.
//
// Every call checks what the real library checks (dimensions, leading dimensions, enums, null
// scalars, batch counts) and, beyond it, that each matrix or vector it will touch lies inside one
// live device allocation (the real library would fault later or quietly read a neighbour) and that
// no two matrices a batch writes share an element (a race there on a GPU). A handle used while
// another device is current fails as the real library's kernel launch would. Live handles are
// kept in a registry, so a destroyed or made-up handle is CUBLAS_STATUS_NOT_INITIALIZED rather than
// a crash.
#include <omp.h>               // omp_set_num_threads: oneDNN's team size on this thread
#include <oneapi/dnnl/dnnl.h>  // dnnl_sgemm

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "cublas_gemm.h"
#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cudasim/sim.h"

struct cublasContext {
  int device = 0;                 // current when the handle was made; it must be current at each call
  cudaStream_t stream = nullptr;  // nullptr: the device's default stream
  cublasPointerMode_t pointerMode = CUBLAS_POINTER_MODE_HOST;
  cublasMath_t mathMode = CUBLAS_DEFAULT_MATH;
};

namespace cudasim {
namespace {

struct Handles {
  std::mutex m;
  std::set<cublasContext*> live;
};

Handles& handles() {
  static Handles* h = new Handles;  // never destroyed: stream threads may outlive static destruction
  return *h;
}

// The handle's settings as they are now, or nullopt for a handle that is not live.
std::optional<cublasContext> settingsOf(cublasHandle_t handle) {
  Handles& h = handles();
  std::lock_guard lock(h.m);
  if (!h.live.count(handle)) return std::nullopt;
  return *handle;
}

// Applies `change` to a live handle; CUBLAS_STATUS_NOT_INITIALIZED for any other.
template <class Change>
cublasStatus_t changeHandle(cublasHandle_t handle, Change change) {
  Handles& h = handles();
  std::lock_guard lock(h.m);
  if (!h.live.count(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  change(*handle);
  return CUBLAS_STATUS_SUCCESS;
}

// The checks every compute call starts with: a live handle whose device is current.
cublasStatus_t usable(cublasHandle_t handle, cublasContext* settings) {
  std::optional<cublasContext> s = settingsOf(handle);
  if (!s) return CUBLAS_STATUS_NOT_INITIALIZED;
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess || device != s->device) return CUBLAS_STATUS_EXECUTION_FAILED;
  *settings = *s;
  return CUBLAS_STATUS_SUCCESS;
}

bool readScalar(const cublasContext& settings, const float* p, Scalar* out) {
  if (!p) return false;
  if (settings.pointerMode == CUBLAS_POINTER_MODE_DEVICE) {
    if (!isDeviceRange(p, sizeof(float))) return false;
    out->device = p;
  } else {
    out->value = *p;
  }
  return true;
}

// Whether `count` matrices of `bytes` each, `stride` elements of `element` bytes apart from p on, lie
// inside one live device allocation: with the stride non-negative, the span from the first one's
// start to the last one's end must. A negative stride is refused, stricter than cuBLAS, which would
// walk back from p: Cohort never means one, so it is taken for a mistake. So is a span past any
// address space.
bool batchOnDevice(const void* p, size_t bytes, int64_t stride, int count, size_t element) {
  int64_t span = 0;
  if (stride < 0 || __builtin_mul_overflow(stride, (count - 1) * static_cast<int64_t>(element), &span) ||
      __builtin_add_overflow(span, bytes, &span)) {
    return false;
  }
  return onDevice(p, static_cast<size_t>(span));
}

// Whether two of `count` m x n matrices (m, n >= 1) with leading dimension ld >= m, `stride` >= 0
// floats apart, share an element. Matrices a span or more apart cannot; nearer ones may still
// interleave without sharing (stride m, ld >= count · m: the matrices side by side in the rows of
// one tall one). Elements d = t · stride apart are rows Δr and columns Δc apart, d = Δr + Δc · ld with
// |Δr| < m, |Δc| < n; for d = q · ld + r (0 <= r < ld) only Δc = q (Δr = r) or Δc = q + 1 (Δr = r - ld)
// can fit. At most span / stride differences are tried, fewer than the elements of one matrix.
bool batchesOverlap(int64_t m, int64_t n, int64_t ld, int64_t stride, int count) {
  const int64_t span = (n - 1) * ld + m;
  for (int64_t t = 1; t < count && t * stride < span; ++t) {
    const int64_t q = t * stride / ld, r = t * stride % ld;
    if ((q < n && r < m) || (q + 1 < n && ld - r < m)) return true;
  }
  return false;
}

// fp32 rounded to TF32's 10 mantissa bits (nearest, ties to even), as tensor cores read their inputs.
float toTf32(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7f800000u) == 0x7f800000u) return x;  // Inf and NaN stay
  bits += 0x0fffu + ((bits >> 13) & 1u);
  return std::bit_cast<float>(bits & ~0x1fffu);
}

bool roundsToTf32(cublasMath_t mode) {
  const int base = mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  return base == CUBLAS_TF32_TENSOR_OP_MATH || base == CUBLAS_TENSOR_OP_MATH;
}

}  // namespace

// The shared pieces (cublas_gemm.h).
size_t elementBytes(cudaDataType type) { return type == CUDA_R_16BF ? 2 : 4; }

size_t spanBytes(int64_t rows, int64_t cols, int64_t ld, size_t element) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<size_t>((cols - 1) * ld + rows) * element;
}

bool onDevice(const void* p, size_t bytes) { return bytes == 0 || (p && isDeviceRange(p, bytes)); }

std::vector<float> packed(const void* p, bool bf16, bool tf32, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t at = i + j * ld;
      const float x = bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[at]) : static_cast<const float*>(p)[at];
      out[static_cast<size_t>(i + j * rows)] = tf32 ? toTf32(x) : x;
    }
  }
  return out;
}

// C = beta · C first (beta == 0: zeros written, C never read, so NaN there does not survive whatever
// sgemm does with 0 · C); then, unless alpha or k is 0 (A and B not read), C += alpha · op(A) · op(B)
// by oneDNN. Column-major C = op(A) · op(B) is row-major Cᵀ = op(B)ᵀ · op(A)ᵀ in the same memory, so
// oneDNN's row-major sgemm gets B's memory first, n and m swapped, the same transpose flags.
// It runs on the stream's thread alone: an operation of a stream is one unit of work, as a kernel
// is; a team per stream would oversubscribe the CPU that the other streams (and the host code
// compared against) share, and the result would depend on the machine's core count.
void runFloatGemm(const Gemm& g, float* c, int64_t ldc) {
  const float alpha = g.alpha.get(), beta = g.beta.get();
  const bool product = alpha != 0.0f && g.k > 0;
  for (int64_t j = 0; j < g.n; ++j) {
    float* column = c + j * ldc;
    if (beta == 0.0f) {
      std::fill(column, column + g.m, 0.0f);
    } else if (!product) {
      for (int64_t i = 0; i < g.m; ++i) column[i] *= beta;
    }
  }
  if (!product) return;
  auto* a = static_cast<const float*>(g.a);
  auto* b = static_cast<const float*>(g.b);
  int64_t lda = g.lda, ldb = g.ldb;
  std::vector<float> packedA, packedB;
  if (g.tf32 || g.bf16) {
    lda = g.transA ? g.k : g.m;
    ldb = g.transB ? g.n : g.k;
    packedA = packed(g.a, g.bf16, g.tf32, lda, g.transA ? g.m : g.k, g.lda);
    packedB = packed(g.b, g.bf16, g.tf32, ldb, g.transB ? g.k : g.n, g.ldb);
    a = packedA.data(), b = packedB.data();
  }
  omp_set_num_threads(1);  // this thread's setting, which oneDNN sizes its team by
  const dnnl_status_t status =
      dnnl_sgemm(g.transB ? 'T' : 'N', g.transA ? 'T' : 'N', g.n, g.m, g.k, alpha, b, ldb, a, lda, beta, c, ldc);
  if (status != dnnl_success) {  // the arguments were checked at the call: a bug here, not the caller's
    std::fprintf(stderr, "cudasim: dnnl_sgemm(%d x %d x %d) failed with status %d\n", g.m, g.n, g.k,
                 static_cast<int>(status));
    std::abort();
  }
}

// A bf16 C is computed in fp32 (widened first where beta reads it) and rounded once at the end.
void runGemm(const Gemm& g) {
  if (!g.bf16C) return runFloatGemm(g, static_cast<float*>(g.c), g.ldc);
  auto* c = static_cast<__nv_bfloat16*>(g.c);
  std::vector<float> wide = packed(c, true, false, g.m, g.n, g.ldc);
  runFloatGemm(g, wide.data(), g.m);
  for (int64_t j = 0; j < g.n; ++j) {
    for (int64_t i = 0; i < g.m; ++i) c[i + j * g.ldc] = __float2bfloat16_rn(wide[static_cast<size_t>(i + j * g.m)]);
  }
}

namespace {

// A strided batch of GEMMs: matrix i of each operand starts i · stride elements after its matrix 0,
// which `first` holds.
struct StridedBatch {
  Gemm first;
  int64_t strideA = 0, strideB = 0, strideC = 0;
  int count = 0;
};

// The GEMMs in batch order, as one operation of the stream (one kernel, on a GPU).
void runBatch(const StridedBatch& batch) {
  Gemm g = batch.first;
  const int64_t ab = g.bf16 ? 2 : 4, c = g.bf16C ? 2 : 4;
  for (int64_t i = 0; i < batch.count; ++i) {
    g.a = static_cast<const char*>(batch.first.a) + i * batch.strideA * ab;
    g.b = static_cast<const char*>(batch.first.b) + i * batch.strideB * ab;
    g.c = static_cast<char*>(batch.first.c) + i * batch.strideC * c;
    runGemm(g);
  }
}

bool validOp(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

cublasStatus_t run(const cublasContext& settings, std::function<void()> op) {
  return enqueue(settings.stream, std::move(op)) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                                : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace
}  // namespace cudasim

using namespace cudasim;

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  int count = 0, device = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDevice(&device) != cudaSuccess) {
    return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  auto* context = new cublasContext;
  context->device = device;
  Handles& h = handles();
  std::lock_guard lock(h.m);
  h.live.insert(context);
  *handle = context;
  return CUBLAS_STATUS_SUCCESS;
}

// Enqueued operations hold copies of everything they need, so nothing waits for them here.
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  Handles& h = handles();
  std::lock_guard lock(h.m);
  if (!h.live.erase(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

// The stream itself is checked when work is enqueued on it, as the real library's launches do.
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  return changeHandle(handle, [&](cublasContext& c) { c.stream = streamId; });
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  const int base = mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
  if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_TENSOR_OP_MATH && base != CUBLAS_PEDANTIC_MATH &&
      base != CUBLAS_TF32_TENSOR_OP_MATH) {
    return settingsOf(handle) ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_NOT_INITIALIZED;
  }
  return changeHandle(handle, [&](cublasContext& c) { c.mathMode = mode; });
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE) {
    return settingsOf(handle) ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_NOT_INITIALIZED;
  }
  return changeHandle(handle, [&](cublasContext& c) { c.pointerMode = mode; });
}

// One SGEMM is a batch of one, its strides unused: the checks and the operation are the batch's.
cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                              const float* beta, float* C, int ldc) {
  return cublasSgemmStridedBatched(handle, transa, transb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* A, int lda,
                                         long long int strideA, const float* B, int ldb, long long int strideB,
                                         const float* beta, float* C, int ldc, long long int strideC, int batchCount) {
  return cublasGemmStridedBatchedEx(handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, strideA, B, CUDA_R_32F,
                                    ldb, strideB, beta, C, CUDA_R_32F, ldc, strideC, batchCount, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
}

// The checks of the reference BLAS's xerbla, in its order, with cuBLAS's batchCount >= 0; then the
// types; then the quick returns; then the operands' memory: op(A) is m x k, so A is stored m x k (N)
// or k x m (T), likewise B. A stride of 0 is legal for A and B: every batch reads the same matrix. C
// matrices that share an element (a stride of 0 among them) make cuBLAS's result undefined, as its
// batches run concurrently: the emulation refuses them, and negative strides (batchOnDevice).
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
  cublasContext settings;
  if (cublasStatus_t s = usable(handle, &settings); s != CUBLAS_STATUS_SUCCESS) return s;
  const bool bf16 = Atype == CUDA_R_16BF;
  const bool tf32 = !bf16 && (computeType == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                              (computeType == CUBLAS_COMPUTE_32F && roundsToTf32(settings.mathMode)));
  StridedBatch batch{.first = {.transA = transa != CUBLAS_OP_N, .transB = transb != CUBLAS_OP_N, .tf32 = tf32,
                               .bf16 = bf16, .bf16C = Ctype == CUDA_R_16BF, .m = m, .n = n, .k = k, .alpha = {},
                               .beta = {}, .a = A, .b = B, .c = C, .lda = lda, .ldb = ldb, .ldc = ldc},
                     .strideA = strideA, .strideB = strideB, .strideC = strideC, .count = batchCount};
  Gemm& g = batch.first;
  const int rowsA = g.transA ? k : m, rowsB = g.transB ? n : k;
  if (!validOp(transa) || !validOp(transb) || m < 0 || n < 0 || k < 0 || lda < std::max(1, rowsA) ||
      ldb < std::max(1, rowsB) || ldc < std::max(1, m) || batchCount < 0) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const bool typesFit = Atype == Btype && (Atype == CUDA_R_32F ? Ctype == CUDA_R_32F
                                                                : Atype == CUDA_R_16BF && (Ctype == CUDA_R_16BF || Ctype == CUDA_R_32F));
  const bool computeFits = computeType == CUBLAS_COMPUTE_32F || computeType == CUBLAS_COMPUTE_32F_PEDANTIC ||
                           (computeType == CUBLAS_COMPUTE_32F_FAST_TF32 && !bf16);
  if (!typesFit || !computeFits || algo != CUBLAS_GEMM_DEFAULT) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!readScalar(settings, static_cast<const float*>(alpha), &g.alpha) ||
      !readScalar(settings, static_cast<const float*>(beta), &g.beta)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (batchCount == 0 || m == 0 || n == 0 || ((k == 0 || g.alpha.knownZero()) && g.beta.knownOne())) {
    return CUBLAS_STATUS_SUCCESS;
  }
  const size_t ab = elementBytes(Atype), c = elementBytes(Ctype);
  const bool readsAB = k > 0 && !g.alpha.knownZero();
  if (readsAB && (!batchOnDevice(A, spanBytes(rowsA, g.transA ? m : k, lda, ab), strideA, batchCount, ab) ||
                  !batchOnDevice(B, spanBytes(rowsB, g.transB ? k : n, ldb, ab), strideB, batchCount, ab))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!batchOnDevice(C, spanBytes(m, n, ldc, c), strideC, batchCount, c) ||
      batchesOverlap(m, n, ldc, strideC, batchCount)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return run(settings, [batch] { runBatch(batch); });
}

cublasStatus_t cublasSscal_v2_64(cublasHandle_t handle, int64_t n, const float* alpha, float* x, int64_t incx) {
  cublasContext settings;
  if (cublasStatus_t s = usable(handle, &settings); s != CUBLAS_STATUS_SUCCESS) return s;
  Scalar a;
  if (!readScalar(settings, alpha, &a)) return CUBLAS_STATUS_INVALID_VALUE;
  if (n <= 0 || incx <= 0) return CUBLAS_STATUS_SUCCESS;
  // One row of n elements with leading dimension incx is the strided vector.
  if (!onDevice(x, spanBytes(1, n, incx))) return CUBLAS_STATUS_INVALID_VALUE;
  return run(settings, [a, x, n, incx] {
    const float value = a.get();
    for (int64_t i = 0; i < n; ++i) x[i * incx] *= value;  // multiplied, as BLAS does: 0 · NaN stays NaN
  });
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
#define COHORT_CUDASIM_NAME(e) \
  case e:                      \
    return #e;
    COHORT_CUDASIM_NAME(CUBLAS_STATUS_SUCCESS)
    COHORT_CUDASIM_NAME(CUBLAS_STATUS_NOT_INITIALIZED)
    COHORT_CUDASIM_NAME(CUBLAS_STATUS_ALLOC_FAILED)
    COHORT_CUDASIM_NAME(CUBLAS_STATUS_INVALID_VALUE)
    COHORT_CUDASIM_NAME(CUBLAS_STATUS_ARCH_MISMATCH)
    COHORT_CUDASIM_NAME(CUBLAS_STATUS_MAPPING_ERROR)
    COHORT_CUDASIM_NAME(CUBLAS_STATUS_EXECUTION_FAILED)
    COHORT_CUDASIM_NAME(CUBLAS_STATUS_INTERNAL_ERROR)
    COHORT_CUDASIM_NAME(CUBLAS_STATUS_NOT_SUPPORTED)
    COHORT_CUDASIM_NAME(CUBLAS_STATUS_LICENSE_ERROR)
#undef COHORT_CUDASIM_NAME
  }
  return "unrecognized status";
}

// libcublas.so.13's own wording.
const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an unsupported value or parameter was passed to the function";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "the function requires an architectural feature absent from the device";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the function failed to launch on the GPU";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the requested functionality is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "the license check failed";
  }
  return "unrecognized status";
}

}  // extern "C"
