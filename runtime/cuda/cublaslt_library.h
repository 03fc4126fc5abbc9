// CublasLtLibrary: the cuBLASLt functions Cohort calls (Blas::gemmFused, runtime/cuda/blas_lt.cc),
// opened at run time as CublasLibrary opens cuBLAS (the contract is runtime/shared_library.h's): it
// opens libcublasLt.so.<CUBLAS_VER_MAJOR>, falling back to COHORT_CUBLAS_DIR. Only built with CUDA.
#pragma once

#include <cublasLt.h>

#include "runtime/shared_library.h"

namespace cohort::runtime::cuda {

struct CublasLtLibrary {
  CublasLtLibrary();

  SharedLibrary library;  // first: the functions below are resolved from it
  // Named after the functions without the cublasLt prefix.
  decltype(&::cublasLtCreate) const create;
  decltype(&::cublasLtDestroy) const destroy;
  decltype(&::cublasLtMatmulDescCreate) const matmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) const matmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) const matmulDescSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) const matrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) const matrixLayoutDestroy;
  decltype(&::cublasLtMatmulPreferenceCreate) const matmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) const matmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) const matmulPreferenceSetAttribute;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) const matmulAlgoGetHeuristic;
  decltype(&::cublasLtMatmulAlgoConfigGetAttribute) const matmulAlgoConfigGetAttribute;
  decltype(&::cublasLtMatmul) const matmul;
  decltype(&::cublasLtGetStatusName) const getStatusName;
  decltype(&::cublasLtGetStatusString) const getStatusString;
};

}  // namespace cohort::runtime::cuda
