// CPU GEMM through OpenBLAS, row-major, float32.
//
// gemm computes C = alpha · op(A) · op(B) + beta · C for row-major matrices, where op(X) is X or Xᵀ
// (GemmOptions::transA / transB). It runs on the calling thread plus OpenBLAS's own pool, whose size
// setBlasThreads() sets for the whole process (one worker process = one BLAS pool; DESIGN.md §6: one
// thread per worker unless --threads says otherwise). Not safe to call setBlasThreads concurrently
// with gemm; gemm itself may be called from one thread at a time per process.
//
//   gemm({.m = 64, .n = 512, .k = 784, .transB = true}, x, w, y);   // y = x · wᵀ
#pragma once

#include <string>

namespace cohort::runtime::cpu {

struct GemmOptions {
  int m = 0;  // rows of op(A) and C
  int n = 0;  // columns of op(B) and C
  int k = 0;  // columns of op(A) = rows of op(B)
  bool transA = false;
  bool transB = false;
  float alpha = 1.0f;
  float beta = 0.0f;
};

void gemm(const GemmOptions& o, const float* a, const float* b, float* c);

// Sets the number of threads OpenBLAS uses in this process (>= 1).
void setBlasThreads(int threads);
int blasThreads();
// "OpenBLAS 0.3.21 (Zen, pthread)" or similar: what is actually linked.
std::string blasDescription();

}  // namespace cohort::runtime::cpu
