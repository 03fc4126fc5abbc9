// GemmOptions: one matrix product C = alpha · op(A) · op(B) + beta · C over row-major float32
// matrices, where op(X) is X or Xᵀ. Shared by the CPU (OpenBLAS, runtime/cpu/blas.h) and CUDA
// (cuBLAS, runtime/cuda/kernels.h) implementations, which follow the same contract.
#pragma once

#include <cstdint>

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

// `count` products of one GemmOptions at once (cuBLAS's ...StridedBatched): product i reads A at
// a + i·strideA and B at b + i·strideB and writes C at c + i·strideC (strides in floats, >= 0; a
// stride of 0 uses one matrix for every product; the C matrices must not overlap).
struct GemmBatch {
  int count = 1;
  int64_t strideA = 0;
  int64_t strideB = 0;
  int64_t strideC = 0;
};

// InvalidArgument naming the problem for negative sizes or strides and overlapping C matrices.
void checkGemmBatch(const GemmOptions& o, const GemmBatch& batch);

}  // namespace cohort::runtime
