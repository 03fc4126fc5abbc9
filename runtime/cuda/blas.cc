// Blas (runtime/cuda/kernels.h): single products through cuBLASLt (blas_lt.h), batches and what
// cuBLASLt cannot run through cuBLAS, on one stream, row-major.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/blas_lt.h"
#include "runtime/cuda/cublas_library.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {
namespace {

[[noreturn]] void throwCublasError(const CublasLibrary& cublas, cublasStatus_t status, const char* call,
                                   const char* file, int line) {
  throwBlasError("cuBLAS", cublas.getStatusName(status), cublas.getStatusString(status), status, call, file, line);
}

// `cublas` is the CublasLibrary whose function `expr` calls.
#define COHORT_CUBLAS_CHECK(cublas, expr)                                           \
  do {                                                                              \
    cublasStatus_t cohort_cublas_status_ = (expr);                                  \
    if (__builtin_expect(cohort_cublas_status_ != CUBLAS_STATUS_SUCCESS, 0)) {      \
      throwCublasError((cublas), cohort_cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                               \
  } while (0)

cublasOperation_t op(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

cudaDataType dataType(DType t) { return t == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

}  // namespace

Blas::Blas(const Stream& stream, const BlasOptions& options) : stream_(stream), options_(options) {
  COHORT_CHECK(stream.device().isCuda()) << "cuBLAS needs a CUDA stream, got " << stream.describe();
  cublas_ = std::make_unique<const CublasLibrary>();
  const CublasLibrary& cublas = *cublas_;
  CudaDeviceGuard guard(stream.device().index);
  cublasHandle_t handle = nullptr;
  COHORT_CUBLAS_CHECK(cublas, cublas.create(&handle));
  try {
    COHORT_CUBLAS_CHECK(cublas, cublas.setStream(handle, static_cast<cudaStream_t>(stream.native())));
    // Full fp32: CUBLAS_DEFAULT_MATH never rounds inputs to TF32 or BF16 (those modes are opt-in),
    // so results stay within float32 rounding of the CPU's OpenBLAS.
    COHORT_CUBLAS_CHECK(cublas, cublas.setMathMode(handle, CUBLAS_DEFAULT_MATH));
    COHORT_CUBLAS_CHECK(cublas, cublas.setPointerMode(handle, CUBLAS_POINTER_MODE_HOST));  // alpha, beta
  } catch (...) {
    cublas.destroy(handle);
    throw;
  }
  handle_ = handle;
}

Blas::~Blas() {
  lt_.reset();
  // The handle's device must be current; a destructor must not throw, so failures are ignored.
  QuietDeviceGuard guard(stream_.device().index);
  cublas_->destroy(static_cast<cublasHandle_t>(handle_));
}

// Row-major C[m, n] is column-major Cᵀ[n, m] in the same memory, and Cᵀ = op(B)ᵀ · op(A)ᵀ. So cuBLAS
// multiplies B's memory (column-major: Bᵀ, or B when transB) by A's, with the operands swapped and
// the same transpose flags. Leading dimensions are the row-major row lengths: k or n for B, m or k
// for A, n for C.
void Blas::gemm(const GemmOptions& o, const float* a, const float* b, float* c) const {
  COHORT_CHECK(o.m >= 0 && o.n >= 0 && o.k >= 0) << "gemm of " << o.m << " x " << o.n << " x " << o.k;
  if (o.m == 0 || o.n == 0) return;
  cublasHandle_t handle = static_cast<cublasHandle_t>(handle_);
  CudaDeviceGuard guard(stream_.device().index);
  if (o.k == 0) {
    // C = beta·C, spelled out rather than left to cuBLAS's handling of empty products; beta == 0
    // overwrites C (BLAS's rule: NaNs in C do not survive).
    size_t count = static_cast<size_t>(o.m) * static_cast<size_t>(o.n);
    if (o.beta == 0.0f) {
      COHORT_CUDA_CHECK(cudaMemsetAsync(c, 0, count * sizeof(float), static_cast<cudaStream_t>(stream_.native())));
    } else if (o.beta != 1.0f) {
      COHORT_CUBLAS_CHECK(*cublas_, cublas_->sscal64(handle, static_cast<int64_t>(count), &o.beta, c, 1));
    }
    return;
  }
  if (ltProduct(o, GemmEpilogue::kNone, DType::kF32, a, b, c, {})) return;
  int lda = o.transA ? o.m : o.k;
  int ldb = o.transB ? o.k : o.n;
  COHORT_CUBLAS_CHECK(*cublas_, cublas_->sgemm(handle, op(o.transB), op(o.transA), o.n, o.m, o.k, &o.alpha, b, ldb, a,
                                               lda, &o.beta, c, o.n));
}

// The same swap per product, with each operand's stride.
void Blas::gemmBatched(const GemmOptions& o, const GemmBatch& batch, const float* a, const float* b, float* c) const {
  checkGemmBatch(o, batch);
  if (o.m == 0 || o.n == 0 || batch.count == 0) return;
  if (o.k == 0) {  // C = beta·C, as gemm spells it out
    for (int i = 0; i < batch.count; ++i) gemm(o, a, b, c + i * batch.strideC);
    return;
  }
  CudaDeviceGuard guard(stream_.device().index);
  const int lda = o.transA ? o.m : o.k;
  const int ldb = o.transB ? o.k : o.n;
  COHORT_CUBLAS_CHECK(*cublas_, cublas_->sgemmStridedBatched(static_cast<cublasHandle_t>(handle_), op(o.transB),
                                                             op(o.transA), o.n, o.m, o.k, &o.alpha, b, ldb, batch.strideB,
                                                             a, lda, batch.strideA, &o.beta, c, o.n, batch.strideC,
                                                             batch.count));
}

void Blas::gemmEx(const GemmOptions& o, const GemmBatch& batch, DType ab, DType cType, const void* a, const void* b,
                  void* c) const {
  checkGemmBatch(o, batch);
  if (ab == DType::kF32 && cType != DType::kF32) {
    COHORT_THROW(InvalidArgument) << "gemmEx: fp32 inputs give an fp32 product, not " << dtypeName(cType);
  }
  if (o.m == 0 || o.n == 0 || batch.count == 0) return;
  CudaDeviceGuard guard(stream_.device().index);
  if (o.k == 0) {  // C = beta·C, for the two betas a layer uses
    if (o.beta != 0.0f && o.beta != 1.0f) COHORT_THROW(InvalidArgument) << "gemmEx with k = 0 and beta " << o.beta;
    if (o.beta == 1.0f) return;
    const size_t bytes = static_cast<size_t>(o.m) * static_cast<size_t>(o.n) * sizeOf(cType);
    for (int i = 0; i < batch.count; ++i) {
      COHORT_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(c) + static_cast<size_t>(i * batch.strideC) * sizeOf(cType), 0,
                                        bytes, static_cast<cudaStream_t>(stream_.native())));
    }
    return;
  }
  if (batch.count == 1 && ltProduct(o, GemmEpilogue::kNone, {ab, cType}, a, b, c, {})) return;
  const int lda = o.transA ? o.m : o.k;
  const int ldb = o.transB ? o.k : o.n;
  COHORT_CUBLAS_CHECK(*cublas_, cublas_->gemmStridedBatchedEx(
                                    static_cast<cublasHandle_t>(handle_), op(o.transB), op(o.transA), o.n, o.m, o.k,
                                    &o.alpha, b, dataType(ab), ldb, batch.strideB, a, dataType(ab), lda, batch.strideA,
                                    &o.beta, c, dataType(cType), o.n, batch.strideC, batch.count, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
}

void Blas::setTf32(bool on) {
  tf32_ = on;
  CudaDeviceGuard guard(stream_.device().index);
  COHORT_CUBLAS_CHECK(*cublas_, cublas_->setMathMode(static_cast<cublasHandle_t>(handle_),
                                                     on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

bool Blas::gemmFused(const GemmOptions& o, GemmEpilogue epilogue, GemmTypes types, const void* a, const void* b,
                     void* c, const EpilogueOperands& operands) const {
  if (o.m <= 0 || o.n <= 0 || o.k <= 0) {
    COHORT_THROW(InvalidArgument) << "gemmFused of " << o.m << " x " << o.n << " x " << o.k
                                  << ": it needs positive sizes";
  }
  if (types.ab == DType::kF32 && types.c != DType::kF32) {
    COHORT_THROW(InvalidArgument) << "gemmFused: fp32 inputs give an fp32 product, not " << dtypeName(types.c);
  }
  return ltProduct(o, epilogue, types, a, b, c, operands);
}

bool Blas::ltProduct(const GemmOptions& o, GemmEpilogue epilogue, GemmTypes types, const void* a, const void* b,
                     void* c, const EpilogueOperands& operands) const {
  CudaDeviceGuard guard(stream_.device().index);
  if (!lt_) lt_ = std::make_unique<LtMatmul>(stream_, options_);
  return lt_->run({.options = o, .epilogue = epilogue, .types = types, .tf32 = tf32_}, a, b, c, operands);
}

std::vector<GemmChoice> Blas::gemmChoices() const { return lt_ ? lt_->choices() : std::vector<GemmChoice>{}; }

int64_t Blas::gemmTunings() const { return lt_ ? lt_->tunings() : 0; }

}  // namespace cohort::runtime::cuda
