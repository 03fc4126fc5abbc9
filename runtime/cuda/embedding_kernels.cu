#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/embedding_kernels.h"
#include "runtime/cuda/launch.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {
namespace {

using launch::firstIndex;
using launch::gridStride;
using launch::kThreads;

// The table row of `id`, or -1 when it is not a whole number in [0, vocab) (NaN fails the first
// test). The same rule as nn::Embedding on the CPU.
__device__ __forceinline__ int64_t rowOf(float id, int64_t vocab) {
  if (!(id >= 0.0f) || floorf(id) != id || id >= 1.0e18f) return -1;
  const auto row = static_cast<int64_t>(id);
  return row < vocab ? row : -1;
}

// ---- forward: a gather ----

__global__ void embeddingGatherKernel(const float* __restrict__ ids, const float* __restrict__ weight,
                                      float* __restrict__ out, int64_t n, int64_t vocab, int64_t dim,
                                      uint32_t* __restrict__ badCount, float nan) {
  const size_t total = static_cast<size_t>(n) * static_cast<size_t>(dim);
  const auto width = static_cast<size_t>(dim);
  for (size_t e = firstIndex(); e < total; e += gridStride()) {
    const size_t i = e / width, d = e - i * width;
    const int64_t row = rowOf(ids[i], vocab);
    if (row >= 0) {
      out[e] = weight[static_cast<size_t>(row) * width + d];
    } else {
      out[e] = nan;
      if (d == 0) atomicAdd(badCount, 1u);  // once per bad position
    }
  }
}

// As embeddingGatherKernel, four columns at a time (dim % 4 == 0, 16-byte aligned table and output).
__global__ void embeddingGather4Kernel(const float* __restrict__ ids, const float4* __restrict__ weight,
                                       float4* __restrict__ out, int64_t n, int64_t vocab, int64_t groups,
                                       uint32_t* __restrict__ badCount, float nan) {
  const size_t total = static_cast<size_t>(n) * static_cast<size_t>(groups);
  const auto width = static_cast<size_t>(groups);
  for (size_t e = firstIndex(); e < total; e += gridStride()) {
    const size_t i = e / width, g = e - i * width;
    const int64_t row = rowOf(ids[i], vocab);
    if (row >= 0) {
      out[e] = weight[static_cast<size_t>(row) * width + g];
    } else {
      out[e] = make_float4(nan, nan, nan, nan);
      if (g == 0) atomicAdd(badCount, 1u);
    }
  }
}

// ---- backward: a stable counting sort of the positions by id, then one sum per gradient element ----

// Work of the backward passes (see embeddingBackward in the header): positions are cut into
// tiles of chunksPerTile chunks of kThreads positions; block b of the count and place kernels owns
// tile b and row b of `before`, the [tiles, vocab] table that first holds each tile's count of
// every id and then, per tile, each id's count in the earlier tiles.

// Block b: zeroes row b of `before`, then counts the good ids of tile b into it.
__global__ void embeddingTileCountKernel(const float* __restrict__ ids, uint32_t* __restrict__ before, int64_t n,
                                         int64_t vocab, int64_t tilePositions) {
  uint32_t* counts = before + static_cast<int64_t>(blockIdx.x) * vocab;
  for (int64_t r = threadIdx.x; r < vocab; r += kThreads) counts[r] = 0u;
  __syncthreads();  // the zeros before any thread's first count
  const int64_t first = static_cast<int64_t>(blockIdx.x) * tilePositions;
  const int64_t end = first + tilePositions < n ? first + tilePositions : n;
  for (int64_t i = first + threadIdx.x; i < end; i += kThreads) {
    const int64_t row = rowOf(ids[i], vocab);
    if (row >= 0) atomicAdd(&counts[row], 1u);  // integer: the total does not depend on the order
  }
}

// Block k covers ids [k·kThreads, (k+1)·kThreads), one thread each: before[b, id] becomes the
// count of id in tiles 0..b-1 (an exclusive scan down the column), counts[id] its count in all
// tiles and blockCounts[k] the block's sum of them.
__global__ void embeddingTileScanKernel(uint32_t* __restrict__ before, uint32_t* __restrict__ counts,
                                        uint32_t* __restrict__ blockCounts, int64_t vocab, int64_t tiles) {
  __shared__ uint32_t blockCount;
  if (threadIdx.x == 0) blockCount = 0u;
  __syncthreads();
  const size_t r = firstIndex();
  if (r < static_cast<size_t>(vocab)) {
    uint32_t running = 0u;
    for (int64_t b = 0; b < tiles; ++b) {
      uint32_t& cell = before[static_cast<size_t>(b) * static_cast<size_t>(vocab) + r];
      const uint32_t here = cell;
      cell = running;
      running += here;
    }
    counts[r] = running;
    atomicAdd(&blockCount, running);  // integer: the same sum in any order
  }
  __syncthreads();
  if (threadIdx.x == 0) blockCounts[blockIdx.x] = blockCount;
}

// Same blocks: counts[id] becomes offsets[id], the good positions with a smaller id (the block's
// base, from the earlier blocks' counts, plus a Hillis-Steele scan within the block), and
// offsets[vocab] the number of good positions. Reads only its own block's ids, so it runs in place.
__global__ void embeddingOffsetScanKernel(uint32_t* __restrict__ offsets, const uint32_t* __restrict__ blockCounts,
                                          int64_t vocab) {
  __shared__ uint32_t base;
  __shared__ uint32_t upTo[kThreads];
  if (threadIdx.x == 0) base = 0u;
  __syncthreads();
  uint32_t earlier = 0u;
  for (unsigned k = threadIdx.x; k < blockIdx.x; k += kThreads) earlier += blockCounts[k];
  atomicAdd(&base, earlier);
  const size_t r = firstIndex();
  const uint32_t count = r < static_cast<size_t>(vocab) ? offsets[r] : 0u;
  upTo[threadIdx.x] = count;
  __syncthreads();
  for (unsigned offset = 1; offset < kThreads; offset *= 2) {
    const uint32_t add = threadIdx.x >= offset ? upTo[threadIdx.x - offset] : 0u;
    __syncthreads();
    upTo[threadIdx.x] += add;
    __syncthreads();
  }
  if (r < static_cast<size_t>(vocab)) offsets[r] = base + upTo[threadIdx.x] - count;
  if (r + 1 == static_cast<size_t>(vocab)) offsets[vocab] = base + upTo[threadIdx.x];
}

// Block b walks tile b a chunk at a time. A good position i with row r goes to
//   sorted[offsets[r] + before[b, r] + (equal rows earlier in its chunk)],
// so each id's positions lie in increasing order; after the chunk, before[b, r] grows by the
// chunk's count of r (block-private row, integer atomics) for the next chunk.
__global__ void embeddingPlaceKernel(const float* __restrict__ ids, const uint32_t* __restrict__ offsets,
                                     uint32_t* __restrict__ before, uint32_t* __restrict__ sorted, int64_t n,
                                     int64_t vocab, int64_t chunksPerTile) {
  __shared__ int32_t chunkRows[kThreads];
  uint32_t* mine = before + static_cast<int64_t>(blockIdx.x) * vocab;
  const int64_t tileStart = static_cast<int64_t>(blockIdx.x) * chunksPerTile * kThreads;
  for (int64_t chunk = 0; chunk < chunksPerTile; ++chunk) {
    const int64_t i = tileStart + chunk * kThreads + threadIdx.x;
    const auto row = static_cast<int32_t>(i < n ? rowOf(ids[i], vocab) : -1);
    chunkRows[threadIdx.x] = row;
    __syncthreads();  // the chunk's rows, and the previous chunk's counts, are in place
    if (row >= 0) {
      uint32_t rank = 0u;
      for (unsigned j = 0; j < threadIdx.x; ++j) rank += chunkRows[j] == row ? 1u : 0u;
      sorted[offsets[row] + mine[row] + rank] = static_cast<uint32_t>(i);
    }
    __syncthreads();  // every read of chunkRows and of mine for this chunk is done
    if (row >= 0 && chunk + 1 < chunksPerTile) atomicAdd(&mine[row], 1u);
  }
}

__device__ __forceinline__ float addRow(float a, float b) { return a + b; }
__device__ __forceinline__ float4 addRow(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
__device__ __forceinline__ float zeroOf(float) { return 0.0f; }
__device__ __forceinline__ float4 zeroOf(float4) { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// One thread per element (T = float) or group of four (T = float4) of gradWeight [vocab, width]:
// starts from 0 (or the element, with accumulate) and adds the row's positions in sorted order,
// which is increasing position order: the CPU's sum, bit for bit. Four loads are issued before
// their four adds, in order, so a long run of one id waits on memory once per four positions.
template <class T>
__global__ void embeddingRowSumKernel(const uint32_t* __restrict__ sorted, const uint32_t* __restrict__ offsets,
                                      const T* __restrict__ gradOut, T* __restrict__ gradWeight, int64_t vocab,
                                      int64_t width, bool accumulate) {
  const size_t total = static_cast<size_t>(vocab) * static_cast<size_t>(width);
  const auto w = static_cast<size_t>(width);
  for (size_t e = firstIndex(); e < total; e += gridStride()) {
    const size_t row = e / w, g = e - row * w;
    uint32_t k = offsets[row];
    const uint32_t end = offsets[row + 1];
    if (accumulate && k == end) continue;  // nothing to add: the element stays as it is
    T acc = accumulate ? gradWeight[e] : zeroOf(T{});
    for (; k + 4 <= end; k += 4) {
      const T v0 = gradOut[sorted[k] * w + g], v1 = gradOut[sorted[k + 1] * w + g];
      const T v2 = gradOut[sorted[k + 2] * w + g], v3 = gradOut[sorted[k + 3] * w + g];
      acc = addRow(addRow(addRow(addRow(acc, v0), v1), v2), v3);
    }
    for (; k < end; ++k) acc = addRow(acc, gradOut[sorted[k] * w + g]);
    gradWeight[e] = acc;
  }
}

// How backward cuts the positions into tiles: as many one-chunk tiles as the [tiles, vocab]
// table allows within kBeforeWords, else fewer tiles of several chunks each. Depends on the shape
// only (the sorted order, and so the result, depends on nothing).
constexpr int64_t kBeforeWords = int64_t{1} << 21;

// Blocks of the tile and offset scans: one thread per id.
int64_t idBlocksFor(int64_t vocab) { return (vocab + kThreads - 1) / kThreads; }

struct TilePlan {
  int64_t tiles = 0, chunksPerTile = 1;
};

TilePlan tilePlan(int64_t n, int64_t vocab) {
  const int64_t chunks = (n + kThreads - 1) / kThreads;
  if (chunks == 0) return {};
  const int64_t maxTiles = kBeforeWords / vocab > 1 ? kBeforeWords / vocab : 1;
  const int64_t wanted = chunks < maxTiles ? chunks : maxTiles;
  const int64_t perTile = (chunks + wanted - 1) / wanted;
  return {(chunks + perTile - 1) / perTile, perTile};
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void embeddingForward(const EmbeddingArgs& a, const Stream& stream) {
  launch::checkCudaStream(stream);
  COHORT_CHECK(a.n >= 0 && a.vocab > 0 && a.dim > 0) << a.n << " ids, table " << a.vocab << " x " << a.dim;
  if (a.n == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  const cudaStream_t native = launch::nativeStream(stream);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const size_t total = static_cast<size_t>(a.n) * static_cast<size_t>(a.dim);
  if (a.dim % 4 == 0 && aligned16(a.weight) && aligned16(a.out)) {
    COHORT_LAUNCH(embeddingGather4Kernel, launch::blocksFor(stream, total / 4), kThreads, 0, native)(
        a.ids, reinterpret_cast<const float4*>(a.weight), reinterpret_cast<float4*>(a.out), a.n, a.vocab, a.dim / 4,
        a.badCount, nan);
  } else {
    COHORT_LAUNCH(embeddingGatherKernel, launch::blocksFor(stream, total), kThreads, 0, native)(
        a.ids, a.weight, a.out, a.n, a.vocab, a.dim, a.badCount, nan);
  }
  COHORT_CUDA_CHECK(cudaGetLastError());
}

int64_t embeddingBackwardScratchWords(int64_t n, int64_t vocab) {
  COHORT_CHECK(n >= 0 && vocab > 0) << n << " ids, vocabulary " << vocab;
  return vocab + 1 + n + idBlocksFor(vocab) + tilePlan(n, vocab).tiles * vocab;
}

void embeddingBackward(const EmbeddingArgs& a, const Stream& stream) {
  launch::checkCudaStream(stream);
  COHORT_CHECK(a.n >= 0 && a.vocab > 0 && a.dim > 0) << a.n << " ids, table " << a.vocab << " x " << a.dim;
  COHORT_CHECK(a.n < (int64_t{1} << 31) && a.vocab < (int64_t{1} << 31)) << a.n << " ids, vocabulary " << a.vocab;
  COHORT_CHECK(a.scratch != nullptr) << "embeddingBackward needs embeddingBackwardScratchWords of scratch";
  if (a.n == 0 && a.accumulate) return;  // nothing to add; overwriting still zeroes the table
  CudaDeviceGuard guard(stream.device().index);
  const cudaStream_t native = launch::nativeStream(stream);
  const TilePlan plan = tilePlan(a.n, a.vocab);
  uint32_t* offsets = a.scratch;             // [vocab + 1]
  uint32_t* sorted = offsets + a.vocab + 1;  // [n]
  uint32_t* blockCounts = sorted + a.n;      // [idBlocks]
  uint32_t* before = blockCounts + idBlocksFor(a.vocab);  // [tiles, vocab]
  const auto tiles = static_cast<unsigned>(plan.tiles);
  const int64_t tilePositions = plan.chunksPerTile * kThreads;
  if (tiles > 0) {
    COHORT_LAUNCH(embeddingTileCountKernel, tiles, kThreads, 0, native)(a.ids, before, a.n, a.vocab, tilePositions);
  }
  const auto vocab = static_cast<size_t>(a.vocab);
  // One thread per id, not grid-strided: the offset scan's blocks need the whole grid's block counts.
  const auto idBlocks = static_cast<unsigned>(idBlocksFor(a.vocab));
  COHORT_LAUNCH(embeddingTileScanKernel, idBlocks, kThreads, 0, native)(before, offsets, blockCounts, a.vocab,
                                                                        plan.tiles);
  COHORT_LAUNCH(embeddingOffsetScanKernel, idBlocks, kThreads, 0, native)(offsets, blockCounts, a.vocab);
  if (tiles > 0) {
    COHORT_LAUNCH(embeddingPlaceKernel, tiles, kThreads, 0, native)(a.ids, offsets, before, sorted, a.n, a.vocab,
                                                                    plan.chunksPerTile);
  }
  if (a.dim % 4 == 0 && aligned16(a.gradOut) && aligned16(a.gradWeight)) {
    const unsigned blocks = launch::blocksFor(stream, vocab * static_cast<size_t>(a.dim / 4));
    COHORT_LAUNCH(embeddingRowSumKernel<float4>, blocks, kThreads, 0, native)(
        sorted, offsets, reinterpret_cast<const float4*>(a.gradOut), reinterpret_cast<float4*>(a.gradWeight), a.vocab,
        a.dim / 4, a.accumulate);
  } else {
    const unsigned blocks = launch::blocksFor(stream, vocab * static_cast<size_t>(a.dim));
    COHORT_LAUNCH(embeddingRowSumKernel<float>, blocks, kThreads, 0, native)(sorted, offsets, a.gradOut, a.gradWeight,
                                                                             a.vocab, a.dim, a.accumulate);
  }
  COHORT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cohort::runtime::cuda
