// The kernels of runtime/cuda/reduce_kernels.h: per-channel sums of x[outer, channels, inner].
//
// The problem. A bias gradient sums a few hundred channels over tens of thousands of elements each
// (a 768-wide Linear at 8192 rows; a conv layer's N·H·W positions). One block per channel tile that
// walks every element leaves most of the GPU idle, and atomics would make the bits depend on timing.
//
// The algorithm. Each channel's elements (outer·inner of them) are cut into chunks; a chunk's size
// and their number depend only on the shape (never on the device), so the order of every addition
// does too: the same bits on every run and every GPU model.
//   stage 1, grid = chunk × channel tile: a block adds its chunk of its channels in a fixed order
//            and writes one float per channel into partial[chunk, channel];
//   stage 2: one warp per channel: lane l adds partials l, l + 32, ... of the channel in chunk
//            order, a fixed xor butterfly adds the 32 lanes, and lane 0 writes (or adds to)
//            sums[channel]. The partials were just written, so the lanes' strided reads hit L2;
//            32 lanes per channel instead of one thread walking every chunk, and channels/8 blocks.
// Stage 1 comes in two layouts, both reading along the contiguous dimension:
//   inner == 1 (Linear, x[rows, channels]): a 32 × 8 block owns a tile of 32 channels (threadIdx.x,
//            so a warp reads 128 contiguous bytes of a row); thread row ty adds rows ty, ty + 8, ...
//            of the chunk, then thread row 0 adds the 8 thread rows in order;
//   inner > 1 (NCHW, x[N, C, H·W]): a 256-thread block owns one channel; thread t adds elements
//            t, t + 256, ... of the chunk (an element e is (o, i) = (e / inner, e % inner), stepped
//            without division), then a fixed shared-memory tree adds the 256 threads.
// Sums are float, as the CPU's bias gradients are.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/elements.h"
#include "runtime/cuda/launch.h"
#include "runtime/cuda/reduce_kernels.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {
namespace {

using namespace launch;  // kThreads, kWarpSize, kWarpsPerBlock, firstIndex, gridStride, ... (launch.h)

// Elements per chunk: at least kMin (16 per thread, enough loads in flight to cover memory latency
// while leaving many blocks: 8192 rows × 768 channels make 64 chunks × 24 tiles = 1536 blocks), more
// once the chunk count would pass kMaxChunks (bounded scratch and stage-2 work). Shape only.
constexpr int64_t kMinChunkRows = 16 * kWarpsPerBlock;  // inner == 1: 128 rows
constexpr int64_t kMinChunkElements = 16 * kThreads;    // inner > 1: 4096 elements
constexpr int64_t kMaxChunks = 1024;
// Grid dimensions stay within every GPU's limits; grid-stride loops take the rest (the order of the
// additions does not depend on which block does them).
constexpr int64_t kMaxGridY = 65535;

int64_t chunkSizeFor(const ChannelSumOptions& o) {
  const int64_t elements = o.outer * o.inner;
  const int64_t least = o.inner == 1 ? kMinChunkRows : kMinChunkElements;
  return std::max(least, (elements + kMaxChunks - 1) / kMaxChunks);
}

int64_t chunksFor(const ChannelSumOptions& o) {
  const int64_t elements = o.outer * o.inner;
  if (elements == 0 || o.channels == 0) return 0;
  return (elements + chunkSizeFor(o) - 1) / chunkSizeFor(o);
}

// Stage 1, inner == 1: block (x, y) sums rows [y·chunkRows, ...) of channel tiles x, x + gridDim.x, ...
// T is float or __nv_bfloat16 (added as floats).
template <class T>
__global__ void channelSumRowsKernel(const T* __restrict__ x, float* __restrict__ partial, int64_t rows,
                                     int64_t channels, int64_t chunkRows) {
  __shared__ float shared[kWarpsPerBlock][kWarpSize];
  const int64_t first = static_cast<int64_t>(blockIdx.y) * chunkRows;
  const int64_t end = first + chunkRows < rows ? first + chunkRows : rows;
  for (int64_t tile = static_cast<int64_t>(blockIdx.x) * kWarpSize; tile < channels;
       tile += static_cast<int64_t>(gridDim.x) * kWarpSize) {
    const int64_t c = tile + threadIdx.x;
    float sum = 0.0f;
    if (c < channels) {
      for (int64_t r = first + threadIdx.y; r < end; r += kWarpsPerBlock) sum += elements::load(x[r * channels + c]);
    }
    shared[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < channels) {
      float total = 0.0f;
      for (unsigned k = 0; k < kWarpsPerBlock; ++k) total += shared[k][threadIdx.x];
      partial[blockIdx.y * channels + c] = total;
    }
    __syncthreads();  // the next tile overwrites the shared sums
  }
}

// Stage 1, inner > 1: block (x, y) sums elements [x·chunkElements, ...) of channels y, y + gridDim.y, ...
__global__ void channelSumInnerKernel(const float* __restrict__ x, float* __restrict__ partial, int64_t outer,
                                      int64_t channels, int64_t inner, int64_t chunkElements) {
  __shared__ float shared[kThreads];
  const int64_t elements = outer * inner;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * chunkElements;
  const int64_t end = first + chunkElements < elements ? first + chunkElements : elements;
  const int64_t stepO = kThreads / inner, stepI = kThreads % inner;
  for (int64_t c = blockIdx.y; c < channels; c += gridDim.y) {
    const int64_t e0 = first + threadIdx.x;
    int64_t o = e0 / inner, i = e0 % inner;
    float sum = 0.0f;
    for (int64_t e = e0; e < end; e += kThreads) {
      sum += x[(o * channels + c) * inner + i];
      o += stepO;
      i += stepI;
      if (i >= inner) {
        i -= inner;
        ++o;
      }
    }
    shared[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned width = kThreads / 2; width > 0; width /= 2) {
      if (threadIdx.x < width) shared[threadIdx.x] += shared[threadIdx.x + width];
      __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x * channels + c] = shared[0];
    __syncthreads();  // the next channel overwrites the shared sums
  }
}

// Stage 2: a warp per channel (RowGroup's rows are the channels here), its lanes over the chunks
// (no chunks: 0). The loop is uniform over the warp, so every lane reaches the shuffles.
__global__ void channelSumFinishKernel(const float* __restrict__ partial, float* __restrict__ sums, int64_t chunks,
                                       int64_t channels, bool accumulate) {
  using G = RowGroup<kWarpSize>;
  for (int64_t c = G::firstRow(); c < channels; c += G::rowStride()) {
    float total = 0.0f;
    for (int64_t k = G::lane(); k < chunks; k += kWarpSize) total += partial[k * channels + c];
    total = groupReduce<kWarpSize>(total, SumOp{});
    if (G::lane() == 0) sums[c] = accumulate ? sums[c] + total : total;
  }
}

void checkShape(const ChannelSumOptions& o) {
  COHORT_CHECK(o.outer >= 0 && o.channels >= 0 && o.inner >= 1)
      << "channelSum of [" << o.outer << ", " << o.channels << ", " << o.inner << "]";
}

}  // namespace

int64_t channelSumScratchFloats(const ChannelSumOptions& options) {
  checkShape(options);
  return chunksFor(options) * options.channels;
}

void channelSum(const ChannelSumBuffers& b, const ChannelSumOptions& o, const Stream& stream) {
  checkCudaStream(stream);
  checkShape(o);
  // With no elements the sums are 0: stage 2 still runs to write them unless it would add nothing.
  if (o.channels == 0 || (o.outer == 0 && o.accumulate)) return;
  CudaDeviceGuard guard(stream.device().index);
  const int64_t chunks = chunksFor(o);
  if (chunks > 0) {
    if (o.inner == 1) {
      const int64_t tiles = (o.channels + kWarpSize - 1) / kWarpSize;
      const dim3 grid(static_cast<unsigned>(std::min(tiles, kMaxGridY)), static_cast<unsigned>(chunks));
      const dim3 block(kWarpSize, kWarpsPerBlock);
      if (b.xType == DType::kBF16) {
        COHORT_LAUNCH(channelSumRowsKernel<__nv_bfloat16>, grid, block, 0, nativeStream(stream))(
            static_cast<const __nv_bfloat16*>(b.x), b.scratch, o.outer, o.channels, chunkSizeFor(o));
      } else {
        COHORT_LAUNCH(channelSumRowsKernel<float>, grid, block, 0, nativeStream(stream))(
            static_cast<const float*>(b.x), b.scratch, o.outer, o.channels, chunkSizeFor(o));
      }
    } else {
      COHORT_CHECK(b.xType == DType::kF32) << "channelSum over inner > 1 reads fp32 only";
      const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(std::min(o.channels, kMaxGridY)));
      COHORT_LAUNCH(channelSumInnerKernel, grid, kThreads, 0, nativeStream(stream))(
          static_cast<const float*>(b.x), b.scratch, o.outer, o.channels, o.inner, chunkSizeFor(o));
    }
    COHORT_CUDA_CHECK(cudaGetLastError());
  }
  COHORT_LAUNCH(channelSumFinishKernel, blocksFor(stream, static_cast<size_t>(o.channels), kWarpsPerBlock), kThreads,
                0, nativeStream(stream))(b.scratch, b.sums, chunks, o.channels, o.accumulate);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cohort::runtime::cuda
