// GemmOptions: one matrix product C = alpha · op(A) · op(B) + beta · C over row-major float32
// matrices, where op(X) is X or Xᵀ. Shared by the CPU (OpenBLAS, runtime/cpu/blas.h) and CUDA
// (cuBLAS, runtime/cuda/kernels.h) implementations, which follow the same contract.
#pragma once

namespace cohort::runtime {

struct GemmOptions {
  int m = 0;  // rows of op(A) and C
  int n = 0;  // columns of op(B) and C
  int k = 0;  // columns of op(A) = rows of op(B)
  bool transA = false;
  bool transB = false;
  float alpha = 1.0f;
  float beta = 0.0f;
};

}  // namespace cohort::runtime
