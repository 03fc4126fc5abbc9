// CPU GEMM through oneDNN's sgemm (Debian's libdnnl), row-major, float32.
//
// gemm computes C = alpha · op(A) · op(B) + beta · C for row-major matrices, where op(X) is X or Xᵀ
// (GemmOptions::transA / transB). oneDNN picks its kernels from the CPU at run time (AVX-512 where
// there is one); it measured 1.1-2.0x OpenBLAS's rate on our layer shapes but the smallest (docs/build.md),
// and OpenBLAS's kernel choice can be forced down by OPENBLAS_CORETYPE. It runs on the calling thread plus
// an OpenMP team of setBlasThreads() threads in total (one worker process = one BLAS pool;
// docs/architecture.md, "Performance principles": one thread per worker unless --threads says
// otherwise); each calling thread applies the count to its own OpenMP setting at its next gemm.
// With several BLAS threads gemm may be called from one thread at a time per process; with one,
// from several threads at once (each runs on its caller; Conv2d's parallel tiles do this inside a
// BlasThreadsScope, and tests/runtime/cpu/blas_test.cc checks it).
//
//   gemm({.m = 64, .n = 512, .k = 784, .transB = true}, x, w, y);   // y = x · wᵀ
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

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

// The loops between the GEMMs (LayerNorm, GELU, softmax, the loss, the optimizer) on the same
// threads: parallelRange(n, grain, f) splits [0, n) into parallelChunks(n, grain) contiguous
// chunks, chunk w being [n·w/C, n·(w+1)/C), and calls f(begin, end, w) for each, on the OpenMP team
// that oneDNN's GEMMs use (the process's setBlasThreads() count; one team, so the loops and the
// GEMMs never compete for cores). C is the BLAS thread count, but no more than n / grain chunks and
// at least 1; with C == 1, f(0, n, 0) runs on the calling thread. The split depends only on n, grain
// and the thread count, so a caller that keeps per-chunk partial sums and adds them in chunk order
// gets the same bits on every run with the same --threads. An exception from f is rethrown after
// every chunk has finished (the lowest chunk's). Thread safety: as gemm; called from inside a
// parallel region (a chunk of another parallelRange, a Conv2d tile), it runs inline.
int parallelChunks(int64_t n, int64_t grain);

using RangeCall = void (*)(void* body, int64_t begin, int64_t end, int chunk);
void parallelRangeCall(int64_t n, int64_t grain, RangeCall call, void* body);

template <class F>
void parallelRange(int64_t n, int64_t grain, F&& f) {
  RangeCall call = [](void* body, int64_t begin, int64_t end, int chunk) {
    (*static_cast<std::remove_reference_t<F>*>(body))(begin, end, chunk);
  };
  parallelRangeCall(n, grain, call, const_cast<void*>(static_cast<const void*>(&f)));
}

// The fewest elements worth a chunk of their own (a few microseconds of a simple loop: below it
// the team's start costs more than it saves).
inline constexpr int64_t kParallelGrain = 16384;
// parallelRange over the rows of a rows x cols matrix, a chunk holding at least kParallelGrain elements.
inline int64_t rowGrain(int64_t cols) { return std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(cols, 1)); }

}  // namespace cohort::runtime::cpu
