// The kernels of runtime/cuda/norm_kernels.h.
//
// GELU is a flat grid-stride kernel that moves four elements per access (float4, or 8 bytes of
// bf16) when every buffer is aligned to that, like the activations of kernels.cu. LayerNorm's row kernels give each row a row group
// (a warp for rows of at most kWarpRowMaxCols columns, else the whole block), as kernels.cu's
// softmax does; the group's partial sums meet through warp shuffles (and, for a block, one pass
// through shared memory), so every thread of the group ends with the same bits and the row loop is
// uniform over the group. The parameter gradients are column sums: see layerNormBackward in the
// header for their two fixed-order stages.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/elements.h"
#include "runtime/cuda/launch.h"
#include "runtime/cuda/norm_kernels.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {
namespace {

using namespace launch;  // kThreads, kWarpSize, blocksFor, firstIndex, RowGroup, groupReduce, ... (launch.h)

// ---- GELU ----

// nn/gelu.cc's constants and operation order.
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__device__ __forceinline__ float geluValue(float x) {
  const float t = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
  return 0.5f * x * (1.0f + t);
}

__device__ __forceinline__ float geluGrad(float x, float dy) {
  const float t = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
  return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}

using elements::load;
using elements::loadQuad;
using elements::quadsFor;
using elements::store;
using elements::storeQuad;

// Elements [0, 4 · quads) four at a time, the rest one by one. x may equal y.
template <class T>
__global__ void geluForwardKernel(const T* x, T* y, size_t n, size_t quads) {
  for (size_t i = firstIndex(); i < quads; i += gridStride()) {
    const float4 v = loadQuad(x, i);
    storeQuad(y, i, make_float4(geluValue(v.x), geluValue(v.y), geluValue(v.z), geluValue(v.w)));
  }
  for (size_t i = 4 * quads + firstIndex(); i < n; i += gridStride()) y[i] = store<T>(geluValue(load(x[i])));
}

// dx has x's type. dy may equal dx.
template <class TX, class TDY>
__global__ void geluBackwardKernel(const TX* x, const TDY* dy, TX* dx, size_t n, size_t quads) {
  for (size_t i = firstIndex(); i < quads; i += gridStride()) {
    const float4 v = loadQuad(x, i);
    const float4 g = loadQuad(dy, i);
    storeQuad(dx, i, make_float4(geluGrad(v.x, g.x), geluGrad(v.y, g.y), geluGrad(v.z, g.z), geluGrad(v.w, g.w)));
  }
  for (size_t i = 4 * quads + firstIndex(); i < n; i += gridStride()) {
    dx[i] = store<TX>(geluGrad(load(x[i]), load(dy[i])));
  }
}

// ---- LayerNorm ----

// As nn::LayerNorm::forward, one row per group.
template <unsigned kWidth, class TX, class TY>
__global__ void layerNormForwardKernel(const TX* __restrict__ x, const float* __restrict__ weight,
                                       const float* __restrict__ bias, TY* __restrict__ y, float* __restrict__ mean,
                                       float* __restrict__ rstd, int64_t rows, int64_t cols, double eps) {
  using G = RowGroup<kWidth>;
  for (int64_t r = G::firstRow(); r < rows; r += G::rowStride()) {
    const TX* xr = x + r * cols;
    TY* yr = y + r * cols;
    double sum = 0.0;
    for (int64_t c = G::lane(); c < cols; c += kWidth) sum += load(xr[c]);
    const double mu = groupReduce<kWidth>(sum, SumOp{}) / static_cast<double>(cols);
    double sq = 0.0;
    for (int64_t c = G::lane(); c < cols; c += kWidth) {
      const double d = load(xr[c]) - mu;
      sq += d * d;
    }
    const double var = groupReduce<kWidth>(sq, SumOp{}) / static_cast<double>(cols);
    const float meanF = static_cast<float>(mu);
    const float inv = static_cast<float>(1.0 / sqrt(var + eps));
    if (G::lane() == 0) {
      mean[r] = meanF;
      rstd[r] = inv;
    }
    for (int64_t c = G::lane(); c < cols; c += kWidth) {
      yr[c] = store<TY>(weight[c] * ((load(xr[c]) - meanF) * inv) + bias[c]);
    }
  }
}

// As nn::LayerNorm::backward's input gradient, one row per group.
template <unsigned kWidth, class TDY, class TX>
__global__ void layerNormInputGradKernel(const TDY* __restrict__ dy, const TX* __restrict__ x,
                                         const float* __restrict__ weight, const float* __restrict__ mean,
                                         const float* __restrict__ rstd, TX* __restrict__ dx, int64_t rows,
                                         int64_t cols) {
  using G = RowGroup<kWidth>;
  for (int64_t r = G::firstRow(); r < rows; r += G::rowStride()) {
    const TDY* dyr = dy + r * cols;
    const TX* xr = x + r * cols;
    TX* dxr = dx + r * cols;
    const float meanF = mean[r], inv = rstd[r];
    double sumG = 0.0, sumGXhat = 0.0;
    for (int64_t c = G::lane(); c < cols; c += kWidth) {
      const float g = load(dyr[c]) * weight[c];
      const float xhat = (load(xr[c]) - meanF) * inv;
      sumG += g;
      sumGXhat += static_cast<double>(g) * xhat;
    }
    const float meanG = static_cast<float>(groupReduce<kWidth>(sumG, SumOp{}) / static_cast<double>(cols));
    const float meanGXhat = static_cast<float>(groupReduce<kWidth>(sumGXhat, SumOp{}) / static_cast<double>(cols));
    for (int64_t c = G::lane(); c < cols; c += kWidth) {
      const float g = load(dyr[c]) * weight[c];
      const float xhat = (load(xr[c]) - meanF) * inv;
      dxr[c] = store<TX>(inv * (g - meanG - xhat * meanGXhat));
    }
  }
}

// Rows per chunk of the parameter-gradient reduction: at least kMinChunkRows (enough work per
// thread row), and more once a chunk count would pass kMaxChunks (bounded scratch). Both depend only
// on the row count, so the order of additions does too.
constexpr int64_t kMinChunkRows = 64;
constexpr int64_t kMaxChunks = 1024;

int64_t chunkRowsFor(int64_t rows) { return std::max(kMinChunkRows, (rows + kMaxChunks - 1) / kMaxChunks); }
int64_t chunksFor(int64_t rows) { return (rows + chunkRowsFor(rows) - 1) / chunkRowsFor(rows); }

// Stage 1 of dweight and dbias: block (x, y) sums chunk blockIdx.y of tiles of kWarpSize columns.
// Thread (tx, ty) adds every kWarpsPerBlock-th row of the chunk from ty in double; thread row 0
// adds the kWarpsPerBlock results in order and writes chunk partials, [chunks, cols] each.
template <class TDY, class TX>
__global__ void layerNormParamPartialsKernel(const TDY* __restrict__ dy, const TX* __restrict__ x,
                                             const float* __restrict__ mean, const float* __restrict__ rstd,
                                             float* __restrict__ partialW, float* __restrict__ partialB, int64_t rows,
                                             int64_t cols, int64_t chunkRows) {
  __shared__ double sharedW[kWarpsPerBlock][kWarpSize];
  __shared__ double sharedB[kWarpsPerBlock][kWarpSize];
  const int64_t first = static_cast<int64_t>(blockIdx.y) * chunkRows;
  const int64_t end = first + chunkRows < rows ? first + chunkRows : rows;
  for (int64_t tile = static_cast<int64_t>(blockIdx.x) * kWarpSize; tile < cols;
       tile += static_cast<int64_t>(gridDim.x) * kWarpSize) {
    const int64_t c = tile + threadIdx.x;
    double sumW = 0.0, sumB = 0.0;
    if (c < cols) {
      for (int64_t r = first + threadIdx.y; r < end; r += kWarpsPerBlock) {
        const float g = load(dy[r * cols + c]);
        const float xhat = (load(x[r * cols + c]) - mean[r]) * rstd[r];
        sumW += static_cast<double>(g) * xhat;
        sumB += g;
      }
    }
    sharedW[threadIdx.y][threadIdx.x] = sumW;
    sharedB[threadIdx.y][threadIdx.x] = sumB;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
      double totalW = 0.0, totalB = 0.0;
      for (unsigned k = 0; k < kWarpsPerBlock; ++k) {
        totalW += sharedW[k][threadIdx.x];
        totalB += sharedB[k][threadIdx.x];
      }
      partialW[blockIdx.y * cols + c] = static_cast<float>(totalW);
      partialB[blockIdx.y * cols + c] = static_cast<float>(totalB);
    }
    __syncthreads();  // the next tile overwrites the shared sums
  }
}

// Stage 2: each column's chunk partials added in chunk order (none: 0).
__global__ void layerNormParamReduceKernel(const float* __restrict__ partialW, const float* __restrict__ partialB,
                                           float* __restrict__ dweight, float* __restrict__ dbias, int64_t chunks,
                                           int64_t cols, bool accumulate) {
  for (int64_t c = static_cast<int64_t>(firstIndex()); c < cols; c += static_cast<int64_t>(gridStride())) {
    double totalW = 0.0, totalB = 0.0;
    for (int64_t k = 0; k < chunks; ++k) {
      totalW += partialW[k * cols + c];
      totalB += partialB[k * cols + c];
    }
    dweight[c] = accumulate ? dweight[c] + static_cast<float>(totalW) : static_cast<float>(totalW);
    dbias[c] = accumulate ? dbias[c] + static_cast<float>(totalB) : static_cast<float>(totalB);
  }
}

void checkShape(const LayerNormOptions& o) {
  COHORT_CHECK(o.rows >= 0 && o.cols >= 1) << "LayerNorm of " << o.rows << " x " << o.cols;
}

}  // namespace

void geluForward(const void* x, void* y, int64_t n, const Stream& stream, DType type) {
  checkCudaStream(stream);
  COHORT_CHECK(n >= 0) << n;
  if (n == 0) return;
  const size_t count = static_cast<size_t>(n);
  const size_t quads = quadsFor(count, {{x, type}, {y, type}});
  CudaDeviceGuard guard(stream.device().index);
  const unsigned blocks = blocksFor(stream, quads > 0 ? quads + count % 4 : count);
  elements::dispatch(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    COHORT_LAUNCH(geluForwardKernel<T>, blocks, kThreads, 0, nativeStream(stream))(
        static_cast<const T*>(x), static_cast<T*>(y), count, quads);
  });
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void geluBackward(const void* x, const void* dy, void* dx, int64_t n, const Stream& stream, DType xType,
                  DType dyType) {
  checkCudaStream(stream);
  COHORT_CHECK(n >= 0) << n;
  if (n == 0) return;
  const size_t count = static_cast<size_t>(n);
  const size_t quads = quadsFor(count, {{x, xType}, {dy, dyType}, {dx, xType}});
  CudaDeviceGuard guard(stream.device().index);
  const unsigned blocks = blocksFor(stream, quads > 0 ? quads + count % 4 : count);
  elements::dispatch(xType, [&](auto xTag) {
    elements::dispatch(dyType, [&](auto dyTag) {
      using TX = typename decltype(xTag)::type;
      using TDY = typename decltype(dyTag)::type;
      COHORT_LAUNCH((geluBackwardKernel<TX, TDY>), blocks, kThreads, 0, nativeStream(stream))(
          static_cast<const TX*>(x), static_cast<const TDY*>(dy), static_cast<TX*>(dx), count, quads);
    });
  });
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void layerNormForward(const LayerNormForwardBuffers& b, const LayerNormOptions& o, const Stream& stream) {
  checkCudaStream(stream);
  checkShape(o);
  if (o.rows == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  const unsigned blocks = rowBlocks(stream, o.rows, o.cols);
  elements::dispatch(b.xType, [&](auto xTag) {
    elements::dispatch(b.yType, [&](auto yTag) {
      using TX = typename decltype(xTag)::type;
      using TY = typename decltype(yTag)::type;
      const auto* x = static_cast<const TX*>(b.x);
      auto* y = static_cast<TY*>(b.y);
      if (warpPerRow(o.cols)) {
        COHORT_LAUNCH((layerNormForwardKernel<kWarpSize, TX, TY>), blocks, kThreads, 0, nativeStream(stream))(
            x, b.weight, b.bias, y, b.mean, b.rstd, o.rows, o.cols, o.eps);
      } else {
        COHORT_LAUNCH((layerNormForwardKernel<kThreads, TX, TY>), blocks, kThreads, 0, nativeStream(stream))(
            x, b.weight, b.bias, y, b.mean, b.rstd, o.rows, o.cols, o.eps);
      }
    });
  });
  COHORT_CUDA_CHECK(cudaGetLastError());
}

int64_t layerNormScratchFloats(int64_t rows, int64_t cols) {
  COHORT_CHECK(rows >= 0 && cols >= 0) << rows << " x " << cols;
  return rows == 0 ? 0 : 2 * chunksFor(rows) * cols;
}

void layerNormBackward(const LayerNormBackwardBuffers& b, const LayerNormOptions& o, const Stream& stream) {
  checkCudaStream(stream);
  checkShape(o);
  // With no rows the sums are 0: the reduction still runs to write them unless it would add nothing.
  if (o.rows == 0 && o.accumulate) return;
  CudaDeviceGuard guard(stream.device().index);
  const int64_t chunks = o.rows == 0 ? 0 : chunksFor(o.rows);
  float* partialW = b.scratch;
  float* partialB = b.scratch + chunks * o.cols;
  elements::dispatch(b.dyType, [&](auto dyTag) {
    elements::dispatch(b.xType, [&](auto xTag) {
      using TDY = typename decltype(dyTag)::type;
      using TX = typename decltype(xTag)::type;
      const auto* dy = static_cast<const TDY*>(b.dy);
      const auto* x = static_cast<const TX*>(b.x);
      if (chunks > 0) {
        const int64_t tiles = (o.cols + kWarpSize - 1) / kWarpSize;
        const dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles, maxBlocks(stream))),
                        static_cast<unsigned>(chunks));
        COHORT_LAUNCH((layerNormParamPartialsKernel<TDY, TX>), grid, dim3(kWarpSize, kWarpsPerBlock), 0,
                      nativeStream(stream))(dy, x, b.mean, b.rstd, partialW, partialB, o.rows, o.cols,
                                            chunkRowsFor(o.rows));
        COHORT_CUDA_CHECK(cudaGetLastError());
      }
      COHORT_LAUNCH(layerNormParamReduceKernel, blocksFor(stream, static_cast<size_t>(o.cols)), kThreads, 0,
                    nativeStream(stream))(partialW, partialB, b.dweight, b.dbias, chunks, o.cols, o.accumulate);
      COHORT_CUDA_CHECK(cudaGetLastError());
      if (b.dx == nullptr || o.rows == 0) return;
      auto* dx = static_cast<TX*>(b.dx);
      const unsigned blocks = rowBlocks(stream, o.rows, o.cols);
      if (warpPerRow(o.cols)) {
        COHORT_LAUNCH((layerNormInputGradKernel<kWarpSize, TDY, TX>), blocks, kThreads, 0, nativeStream(stream))(
            dy, x, b.weight, b.mean, b.rstd, dx, o.rows, o.cols);
      } else {
        COHORT_LAUNCH((layerNormInputGradKernel<kThreads, TDY, TX>), blocks, kThreads, 0, nativeStream(stream))(
            dy, x, b.weight, b.mean, b.rstd, dx, o.rows, o.cols);
      }
      COHORT_CUDA_CHECK(cudaGetLastError());
    });
  });
}

}  // namespace cohort::runtime::cuda
