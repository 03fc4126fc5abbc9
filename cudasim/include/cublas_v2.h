// cudasim's cublas_v2.h: the subset of cuBLAS that Cohort calls (runtime/cuda/blas.cc, through the
// table in runtime/cuda/cublas_library.h), emulated on the CPU (docs/gpu.md, "The emulated device").
// Names, types, values and signatures are the real library's, so the table's decltype(&::fn) match;
// only the cudasim configuration puts this directory on the include path.
//
// Conventions as in cuBLAS: matrices are column-major with leading dimensions; alpha and beta are
// host pointers read at the call (CUBLAS_POINTER_MODE_HOST, the default) or device pointers read
// when the operation runs (CUBLAS_POINTER_MODE_DEVICE). Each compute call checks its arguments at
// the call (a status, nothing enqueued, on failure) and then runs as one operation of the handle's
// stream (the default stream until cublasSetStream), so it is asynchronous and in stream order.
// CUBLAS_TF32_TENSOR_OP_MATH and CUBLAS_TENSOR_OP_MATH round the products' inputs to TF32, as the
// tensor cores would; the other modes compute in full fp32. Sums accumulate in fp32 (oneDNN's sgemm
// on the CPU), in an order of their own, so results agree with other BLASes to float rounding.
// Thread safety: as cuBLAS's, one thread at a time per handle; handles may be used from any thread.
//
//   cublasHandle_t handle;
//   cublasCreate(&handle);
//   cublasSetStream(handle, stream);
//   cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc);
#pragma once

#include <cstdint>

#include "cuda_runtime.h"
#include "library_types.h"

#define CUBLAS_VER_MAJOR 13
#define CUBLAS_VER_MINOR 1
#define CUBLAS_VER_PATCH 0
#define CUBLAS_VERSION (CUBLAS_VER_MAJOR * 10000 + CUBLAS_VER_MINOR * 100 + CUBLAS_VER_PATCH)

extern "C" {

typedef enum {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16,
} cublasStatus_t;

// CUBLAS_OP_C is CUBLAS_OP_T for real matrices.
typedef enum {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
  CUBLAS_OP_C = 2,
} cublasOperation_t;

typedef enum {
  CUBLAS_POINTER_MODE_HOST = 0,
  CUBLAS_POINTER_MODE_DEVICE = 1,
} cublasPointerMode_t;

// A mode, optionally with CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION or'ed in.
typedef enum {
  CUBLAS_DEFAULT_MATH = 0,
  CUBLAS_TENSOR_OP_MATH = 1,
  CUBLAS_PEDANTIC_MATH = 2,
  CUBLAS_TF32_TENSOR_OP_MATH = 3,
  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16,
} cublasMath_t;

// How cublasGemmStridedBatchedEx multiplies: CUBLAS_COMPUTE_32F (fp32 accumulation; fp32 inputs
// take the handle's math mode, bf16 inputs run on tensor cores), _PEDANTIC (fp32, never TF32),
// _FAST_TF32 (fp32 inputs rounded to TF32).
typedef enum {
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_PEDANTIC = 69,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;

typedef enum {
  CUBLAS_GEMM_DEFAULT = -1,
} cublasGemmAlgo_t;

typedef struct cublasContext* cublasHandle_t;

// CUBLAS_STATUS_NOT_INITIALIZED without a device.
cublasStatus_t cublasCreate_v2(cublasHandle_t* handle);
// The handle is gone at once; operations already enqueued still run (they hold their arguments).
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode);

// C = alpha · op(A) · op(B) + beta · C; C is m x n, op(A) m x k, op(B) k x n. With beta == 0, C is
// not read (NaN there does not survive); with alpha == 0 or k == 0, A and B are not read.
cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                              int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                              const float* beta, float* C, int ldc);
// For each i < batchCount, the SGEMM above on the matrices starting i · stride floats after A, B and
// C: C + i · strideC = alpha · op(A + i · strideA) · op(B + i · strideB) + beta · (C + i · strideC), all
// as one operation. A stride of 0 gives every batch the same A or B. Stricter than cuBLAS: a negative
// stride, or C matrices that share an element (undefined there), is CUBLAS_STATUS_INVALID_VALUE.
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float* alpha, const float* A, int lda,
                                         long long int strideA, const float* B, int ldb, long long int strideB,
                                         const float* beta, float* C, int ldc, long long int strideC, int batchCount);
// The strided batch above with each matrix's element type: A and B both CUDA_R_32F (C CUDA_R_32F) or
// both CUDA_R_16BF (C CUDA_R_16BF or CUDA_R_32F); alpha and beta are floats; strides count elements;
// computeType as above. Products of bf16 inputs are exact in fp32 and summed in fp32, as on tensor
// cores; a bf16 C is rounded once at the end (to nearest, ties to even). Any other combination of
// types is CUBLAS_STATUS_NOT_SUPPORTED; algo must be CUBLAS_GEMM_DEFAULT.
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo);
// x[i · incx] *= alpha for i < n; nothing for n <= 0 or incx <= 0.
cublasStatus_t cublasSscal_v2_64(cublasHandle_t handle, int64_t n, const float* alpha, float* x, int64_t incx);

// "CUBLAS_STATUS_INVALID_VALUE" and its description, as the real library spells them.
const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);

}  // extern "C"

// The real header's names without _v2.
#define cublasCreate cublasCreate_v2
#define cublasDestroy cublasDestroy_v2
#define cublasSetStream cublasSetStream_v2
#define cublasSetPointerMode cublasSetPointerMode_v2
#define cublasSgemm cublasSgemm_v2
#define cublasSscal_64 cublasSscal_v2_64
