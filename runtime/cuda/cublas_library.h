// CublasLibrary: the cuBLAS functions Cohort calls (cuda::Blas), opened at run time when the first
// Blas is made rather than linked: a linked cuBLAS, with the cuBLASLt it needs, costs every process
// about 200 MB resident at start, CPU workers included. The contract of these tables (where the
// library is looked for, errors, lifetime, thread safety) is in runtime/shared_library.h; this one
// opens libcublas.so.<CUBLAS_VER_MAJOR>, falling back to COHORT_CUBLAS_DIR. Only built with CUDA.
//
//   CublasLibrary cublas;
//   cublasHandle_t handle;
//   cublas.create(&handle);
#pragma once

#include <cublas_v2.h>

#include "runtime/shared_library.h"

namespace cohort::runtime::cuda {

struct CublasLibrary {
  CublasLibrary();

  SharedLibrary library;  // first: the functions below are resolved from it
  // Named after cublas_v2.h's macros without the prefix (cublasCreate is cublasCreate_v2).
  decltype(&::cublasCreate_v2) const create;
  decltype(&::cublasDestroy_v2) const destroy;
  decltype(&::cublasSetStream_v2) const setStream;
  decltype(&::cublasSetMathMode) const setMathMode;
  decltype(&::cublasSetPointerMode_v2) const setPointerMode;
  decltype(&::cublasSgemm_v2) const sgemm;
  decltype(&::cublasSgemmStridedBatched) const sgemmStridedBatched;
  // The real header overloads this name (an inline form taking a cudaDataType compute type): the
  // table names the library's own function's type.
  using GemmStridedBatchedEx = cublasStatus_t(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                              const void*, const void*, cudaDataType, int, long long int, const void*,
                                              cudaDataType, int, long long int, const void*, void*, cudaDataType, int,
                                              long long int, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmStridedBatchedEx* const gemmStridedBatchedEx;
  decltype(&::cublasSscal_v2_64) const sscal64;
  decltype(&::cublasGetStatusName) const getStatusName;
  decltype(&::cublasGetStatusString) const getStatusString;
};

}  // namespace cohort::runtime::cuda
