// CPU GEMM through oneDNN's sgemm (Debian's libdnnl), row-major, float32.
//
// gemm computes C = alpha · op(A) · op(B) + beta · C for row-major matrices, where op(X) is X or Xᵀ
// (GemmOptions::transA / transB). oneDNN picks its kernels from the CPU at run time (AVX-512 where
// there is one); it measured 1.1-2.0x OpenBLAS's rate on our layer shapes but the smallest (docs/build.md),
// and OpenBLAS's kernel choice can be forced down by OPENBLAS_CORETYPE. It runs on the calling thread plus
// an OpenMP team of setBlasThreads() threads in total (one worker process = one BLAS pool;
// DESIGN.md §6: one thread per worker unless --threads says otherwise); each calling thread applies
// the count to its own OpenMP setting at its next gemm. With several BLAS threads gemm may be called
// from one thread at a time per process; with one, from several threads at once (each runs on its
// caller; Conv2d's parallel tiles do this inside a BlasThreadsScope, and
// tests/runtime/cpu/blas_test.cc checks it).
//
//   gemm({.m = 64, .n = 512, .k = 784, .transB = true}, x, w, y);   // y = x · wᵀ
#pragma once

#include <string>

#include "runtime/gemm_options.h"

namespace cohort::runtime::cpu {

using GemmOptions = runtime::GemmOptions;
using GemmBatch = runtime::GemmBatch;

void gemm(const GemmOptions& o, const float* a, const float* b, float* c);

// batch.count products of `o` (runtime/gemm_options.h), as one oneDNN batched matmul: the BLAS
// threads split the batch as well as each product, and small products (attention's per-head
// ones) run at about twice the rate of a loop of gemm calls. The matmul for a shape is made once
// per calling thread and kept (a few dozen shapes at most; the first of each costs milliseconds).
// Same thread-safety rule as gemm.
void gemmBatched(const GemmOptions& o, const GemmBatch& batch, const float* a, const float* b, float* c);

// Sets the number of threads a gemm uses in this process (>= 1).
void setBlasThreads(int threads);
int blasThreads();

// Sets the BLAS thread count for the scope's lifetime and restores the previous count on exit
// (also when an exception leaves the scope). Same thread-safety rule as setBlasThreads.
class BlasThreadsScope {
 public:
  explicit BlasThreadsScope(int threads);
  ~BlasThreadsScope();
  BlasThreadsScope(const BlasThreadsScope&) = delete;
  BlasThreadsScope& operator=(const BlasThreadsScope&) = delete;

 private:
  int previous_;
};
// "oneDNN 2.6.3 sgemm (AVX-512, OpenMP)" or similar: what is actually linked and its kernels.
std::string blasDescription();

}  // namespace cohort::runtime::cpu
