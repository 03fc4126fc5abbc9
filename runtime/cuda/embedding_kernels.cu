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

// ---- backward: each block owns rows [firstRow, endRow) of gradWeight ----

// Thread t handles columns t, t + kThreads, ... of every owned row, for the zeroing as for the
// additions, so each gradient element has one writer and sees its additions in position order.
// Per tile of kThreads positions: flag the positions whose id falls in the block's rows, an
// inclusive prefix sum of the flags (Hillis-Steele in shared memory) gives each its slot in a
// list kept in position order, then the block adds the listed rows one after another.
__global__ void embeddingScatterAddKernel(const float* __restrict__ ids, const float* __restrict__ gradOut,
                                          float* __restrict__ gradWeight, int64_t n, int64_t vocab, int64_t dim,
                                          int64_t rowsPerBlock, bool accumulate) {
  __shared__ unsigned slot[kThreads];
  __shared__ int64_t listPosition[kThreads];
  __shared__ int64_t listRow[kThreads];
  const int64_t firstRow = static_cast<int64_t>(blockIdx.x) * rowsPerBlock;
  const int64_t endRow = firstRow + rowsPerBlock < vocab ? firstRow + rowsPerBlock : vocab;
  if (firstRow >= endRow) return;  // the whole block: no barrier is skipped by part of it
  if (!accumulate) {
    for (int64_t r = firstRow; r < endRow; ++r) {
      for (int64_t d = threadIdx.x; d < dim; d += kThreads) gradWeight[r * dim + d] = 0.0f;
    }
  }
  for (int64_t tile = 0; tile < n; tile += kThreads) {
    const int64_t i = tile + threadIdx.x;
    int64_t row = i < n ? rowOf(ids[i], vocab) : -1;
    if (row < firstRow || row >= endRow) row = -1;
    slot[threadIdx.x] = row >= 0 ? 1u : 0u;
    __syncthreads();
    for (unsigned offset = 1; offset < kThreads; offset *= 2) {
      const unsigned add = threadIdx.x >= offset ? slot[threadIdx.x - offset] : 0u;
      __syncthreads();
      slot[threadIdx.x] += add;
      __syncthreads();
    }
    if (row >= 0) {
      listPosition[slot[threadIdx.x] - 1] = i;
      listRow[slot[threadIdx.x] - 1] = row;
    }
    const unsigned listed = slot[kThreads - 1];
    __syncthreads();
    for (unsigned k = 0; k < listed; ++k) {
      const float* src = gradOut + listPosition[k] * dim;
      float* dst = gradWeight + listRow[k] * dim;
      for (int64_t d = threadIdx.x; d < dim; d += kThreads) dst[d] += src[d];
    }
    __syncthreads();  // before the next tile overwrites slot and the list
  }
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

void embeddingBackward(const EmbeddingArgs& a, const Stream& stream) {
  launch::checkCudaStream(stream);
  COHORT_CHECK(a.n >= 0 && a.vocab > 0 && a.dim > 0) << a.n << " ids, table " << a.vocab << " x " << a.dim;
  if (a.n == 0 && a.accumulate) return;  // nothing to add; overwriting still zeroes the table
  CudaDeviceGuard guard(stream.device().index);
  // As many blocks as fill the device, each owning an equal range of rows: every block reads all
  // the ids, so more blocks would only multiply that traffic.
  const auto vocab = static_cast<size_t>(a.vocab);
  const size_t wanted = vocab < launch::maxBlocks(stream) ? vocab : launch::maxBlocks(stream);
  const size_t rowsPerBlock = (vocab + wanted - 1) / wanted;
  const auto blocks = static_cast<unsigned>((vocab + rowsPerBlock - 1) / rowsPerBlock);
  COHORT_LAUNCH(embeddingScatterAddKernel, blocks, kThreads, 0, launch::nativeStream(stream))(
      a.ids, a.gradOut, a.gradWeight, a.n, a.vocab, a.dim, static_cast<int64_t>(rowsPerBlock), a.accumulate);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cohort::runtime::cuda
