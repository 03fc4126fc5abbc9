// Launch helpers shared by the .cu files of runtime/cuda/ (internal to them): block size, grid
// sizing for grid-stride loops, and the stream checks every kernel entry point makes.
// Grids are capped at kBlocksPerSm blocks per multiprocessor of the stream's device, which the
// caller has made current; grid-stride loops cover the rest of the work.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/step_guard.h"
#include "runtime/error.h"
#include "runtime/stream.h"

// COHORT_LAUNCH(kernel, grid, block, sharedBytes, stream)(args...): `kernel<<<grid, block,
// sharedBytes, stream>>>(args...)` under nvcc; under cudasim (the emulated device, cudasim/, where
// g++ compiles the .cu files) the emulation's launch. Every launch in Cohort's .cu files goes
// through it, so one source serves both.
#ifdef COHORT_CUDASIM
#define COHORT_LAUNCH(kernel, grid, block, sharedBytes, stream) \
  ::cudasim::Launch(kernel, #kernel, grid, block, sharedBytes, stream)
#else
#define COHORT_LAUNCH(kernel, grid, block, sharedBytes, stream) kernel<<<grid, block, sharedBytes, stream>>>
#endif

namespace cohort::runtime::cuda::launch {

constexpr unsigned kThreads = 256;
constexpr unsigned kWarpSize = 32;
constexpr unsigned kWarpsPerBlock = kThreads / kWarpSize;
constexpr unsigned kFullMask = 0xffffffffu;
// Enough resident blocks to fill every SM several times over; grid-stride loops do the rest.
constexpr int kBlocksPerSm = 8;

inline void checkCudaStream(const Stream& stream) {
  COHORT_CHECK(stream.device().isCuda()) << "CUDA kernel launched on " << stream.describe();
}

inline cudaStream_t nativeStream(const Stream& stream) { return static_cast<cudaStream_t>(stream.native()); }

// Most blocks worth launching on the stream's device, which the caller has made current.
inline size_t maxBlocks(const Stream& stream) {
  int sms = 0;
  COHORT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, stream.device().index));
  return static_cast<size_t>(std::max(sms, 1)) * kBlocksPerSm;
}

// Blocks for `work` items when one block takes `perBlock` of them per pass.
inline unsigned blocksFor(const Stream& stream, size_t work, size_t perBlock = kThreads) {
  size_t wanted = (work + perBlock - 1) / perBlock;
  return static_cast<unsigned>(std::clamp<size_t>(wanted, 1, maxBlocks(stream)));
}

__device__ __forceinline__ size_t firstIndex() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t gridStride() { return static_cast<size_t>(blockDim.x) * gridDim.x; }

// Σ v over the block (blockDim.x == kThreads), in a fixed tree order; every thread gets the result.
__device__ inline double blockSum(double v) {
  __shared__ double partial[kThreads];
  partial[threadIdx.x] = v;
  __syncthreads();
  for (unsigned half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  const double total = partial[0];
  __syncthreads();  // before the next call overwrites partial
  return total;
}

// ---- multi-tensor optimizer steps (step_guard.h) ----

// Which options of a multi-tensor optimizer kernel's arguments (step_guard.h, OptimizerStepArgs: its
// blocks of kOptimizerRatesPerBlock rates) the step takes: kNone when it applies nothing; else
// those for the step count the device holds, with `mult` the gradient's multiplier (1 without a
// control).
enum class StepCount { kNone, kSettled, kOneMore };
template <class Options>
__device__ __forceinline__ StepCount chunkArgs(const StepControl* control, const OptimizerStepArgs<Options>* args,
                                               float& mult) {
  mult = 1.0f;
  if (control == nullptr) return StepCount::kSettled;
  if (!control->apply) return StepCount::kNone;
  mult = control->gradMultiplier;
  return control->appliedBefore == args->settledSteps ? StepCount::kSettled : StepCount::kOneMore;
}
// Rate `rate`'s options for the step count `which` (not kNone).
template <class Options>
__device__ __forceinline__ const Options& rateArgs(const OptimizerStepArgs<Options>* args, StepCount which, int rate) {
  const OptimizerStepArgs<Options>& block = args[rate / kOptimizerRatesPerBlock];
  const int r = rate % kOptimizerRatesPerBlock;
  return which == StepCount::kSettled ? block.ifSettled[r] : block.ifOneMore[r];
}

// The block's threads over one chunk's elements: one(i) for element i, quad(q) for elements 4q..4q+3
// where `vectorize` (every buffer aligned for quads) and the quad lies inside the chunk; the chunk's
// unaligned ends one by one. Each element is visited once, whatever the split.
template <class One, class Quad>
__device__ __forceinline__ void forChunkElements(const OptimizerChunk& chunk, bool vectorize, One one, Quad quad) {
  const long long begin = chunk.begin, end = chunk.begin + chunk.count;
  // [begin, quadsBegin) one by one, [quadsBegin, quadsEnd) in quads (both multiples of 4 when it
  // is not empty), [quadsEnd, end) one by one.
  const long long aligned = (begin + 3) / 4 * 4;
  const long long quadsBegin = vectorize && aligned < end ? aligned : end;
  const long long quadsEnd = end / 4 * 4 > quadsBegin ? end / 4 * 4 : quadsBegin;
  for (long long i = begin + threadIdx.x; i < quadsBegin; i += blockDim.x) one(static_cast<size_t>(i));
  for (long long q = quadsBegin / 4 + threadIdx.x; q < quadsEnd / 4; q += blockDim.x) quad(static_cast<size_t>(q));
  for (long long i = quadsEnd + threadIdx.x; i < end; i += blockDim.x) one(static_cast<size_t>(i));
}

// ---- row groups (row-wise kernels: softmax, losses, LayerNorm) ----

// Rows up to this wide get one warp (no barriers, kWarpsPerBlock rows per block); wider rows a
// whole block.
constexpr int64_t kWarpRowMaxCols = 1024;

// Whether a row of `cols` columns gets a warp (else a block).
inline bool warpPerRow(int64_t cols) { return cols <= kWarpRowMaxCols; }

// Blocks for a row kernel: kWarpsPerBlock rows per block with a warp per row, else one.
inline unsigned rowBlocks(const Stream& stream, int64_t rows, int64_t cols) {
  return blocksFor(stream, static_cast<size_t>(rows), warpPerRow(cols) ? kWarpsPerBlock : 1);
}

// kWidth threads (a warp, or the whole kThreads block) cooperate on one row at a time.
template <unsigned kWidth>
struct RowGroup {
  static_assert(kWidth == kWarpSize || kWidth == kThreads);
  static constexpr unsigned kRowsPerBlock = kThreads / kWidth;
  __device__ static unsigned lane() { return threadIdx.x % kWidth; }
  __device__ static unsigned groupInBlock() { return threadIdx.x / kWidth; }
  __device__ static int64_t firstRow() { return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + groupInBlock(); }
  __device__ static int64_t rowStride() { return static_cast<int64_t>(gridDim.x) * kRowsPerBlock; }
};

struct MaxOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return b > a ? b : a;
  }
};

struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// Combines v over the row group. The xor butterfly gives every lane of a warp the same bits; a
// block then combines its warps' results in the same order in every thread.
template <unsigned kWidth, class T, class Op>
__device__ T groupReduce(T v, Op op) {
  for (unsigned offset = kWarpSize / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  if constexpr (kWidth == kWarpSize) {
    return v;
  } else {
    __shared__ T perWarp[kWarpsPerBlock];
    __syncthreads();  // readers of the previous reduction are done with perWarp
    if (threadIdx.x % kWarpSize == 0) perWarp[threadIdx.x / kWarpSize] = v;
    __syncthreads();
    T total = perWarp[0];
    for (unsigned w = 1; w < kWarpsPerBlock; ++w) total = op(total, perWarp[w]);
    return total;
  }
}

}  // namespace cohort::runtime::cuda::launch
