// The image kernels of runtime/cuda/kernels.h: max and average pooling, batch normalisation.
//
// Pooling: one thread per output element forward, one per input element backward. Backward gathers
// (each input element visits the windows that cover it, in the CPU's window order) rather than
// scattering with atomics, so overlapping windows (kernel > stride) give the CPU's sums bit for bit
// and the same bits on every run.
// Batch normalisation: one block per channel, reducing in double through shared memory in a fixed
// tree order (deterministic); the statistics and the running-average update follow
// nn/batchnorm.cc. With few channels this leaves SMs idle; it is not on any benchmarked path yet.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/launch.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {
namespace {

using namespace launch;  // kThreads, blocksFor, firstIndex, ... (launch.h)

// nn/pool.cc's rule: strictly greater (so the first maximum wins), or NaN (which propagates).
__device__ __forceinline__ bool beats(float v, float best) { return v > best || v != v; }

// Output rows (or columns) whose window covers input row r: [first, last], possibly empty.
struct Cover {
  int64_t first, last;
};
__device__ __forceinline__ Cover coverOf(int64_t r, int64_t kernel, int64_t stride, int64_t outSize) {
  const int64_t first = r < kernel ? 0 : (r - kernel) / stride + 1;
  const int64_t last = min(r / stride, outSize - 1);
  return {first, last};
}

// Calls f(k) for each output element k (within the plane) whose window covers input element e of
// its plane, in the CPU's window order (rows, then columns).
template <class F>
__device__ __forceinline__ void forEachCoveringWindow(size_t e, const PoolShape& s, F f) {
  const int64_t r = static_cast<int64_t>(e) / s.width, c = static_cast<int64_t>(e) % s.width;
  const Cover rows = coverOf(r, s.kernel, s.stride, s.outHeight), cols = coverOf(c, s.kernel, s.stride, s.outWidth);
  for (int64_t i = rows.first; i <= rows.last; ++i) {
    for (int64_t j = cols.first; j <= cols.last; ++j) f(i * s.outWidth + j);
  }
}

__global__ void maxPoolForwardKernel(const float* x, float* y, int32_t* argmax, PoolShape s, size_t total) {
  const size_t outPlane = static_cast<size_t>(s.outHeight * s.outWidth);
  for (size_t idx = firstIndex(); idx < total; idx += gridStride()) {
    const size_t p = idx / outPlane, o = idx % outPlane;
    const int64_t i = static_cast<int64_t>(o) / s.outWidth, j = static_cast<int64_t>(o) % s.outWidth;
    const float* plane = x + p * static_cast<size_t>(s.height * s.width);
    const int64_t corner = i * s.stride * s.width + j * s.stride;
    float best = plane[corner];
    int64_t at = corner;
    for (int64_t u = 0; u < s.kernel; ++u) {
      for (int64_t v = 0; v < s.kernel; ++v) {
        const int64_t k = corner + u * s.width + v;
        const float value = plane[k];
        if (beats(value, best)) best = value, at = k;
      }
    }
    y[idx] = best;
    argmax[idx] = static_cast<int32_t>(at);
  }
}

__global__ void maxPoolBackwardKernel(const float* dy, const int32_t* argmax, float* dx, PoolShape s, size_t total) {
  const size_t inPlane = static_cast<size_t>(s.height * s.width),
               outPlane = static_cast<size_t>(s.outHeight * s.outWidth);
  for (size_t idx = firstIndex(); idx < total; idx += gridStride()) {
    const size_t p = idx / inPlane, e = idx % inPlane;
    const float* g = dy + p * outPlane;
    const int32_t* a = argmax + p * outPlane;
    float sum = 0.0f;
    forEachCoveringWindow(e, s, [&](int64_t k) {
      if (a[k] == static_cast<int32_t>(e)) sum += g[k];
    });
    dx[idx] = sum;
  }
}

__global__ void avgPoolForwardKernel(const float* x, float* y, PoolShape s, float scale, size_t total) {
  const size_t outPlane = static_cast<size_t>(s.outHeight * s.outWidth);
  for (size_t idx = firstIndex(); idx < total; idx += gridStride()) {
    const size_t p = idx / outPlane, o = idx % outPlane;
    const int64_t i = static_cast<int64_t>(o) / s.outWidth, j = static_cast<int64_t>(o) % s.outWidth;
    const float* plane = x + p * static_cast<size_t>(s.height * s.width);
    float sum = 0.0f;
    for (int64_t u = 0; u < s.kernel; ++u) {
      const float* row = plane + (i * s.stride + u) * s.width + j * s.stride;
      for (int64_t v = 0; v < s.kernel; ++v) sum += row[v];
    }
    y[idx] = sum * scale;
  }
}

__global__ void avgPoolBackwardKernel(const float* dy, float* dx, PoolShape s, float scale, size_t total) {
  const size_t inPlane = static_cast<size_t>(s.height * s.width),
               outPlane = static_cast<size_t>(s.outHeight * s.outWidth);
  for (size_t idx = firstIndex(); idx < total; idx += gridStride()) {
    const size_t p = idx / inPlane, e = idx % inPlane;
    const float* g = dy + p * outPlane;
    float sum = 0.0f;
    // The product rounded before the sum, as the CPU rounds g·scale before adding it: a fused
    // multiply-add (what the compiler makes of `sum += g[k] * scale`) differs in the last bit.
    forEachCoveringWindow(e, s, [&](int64_t k) { sum += __fmul_rn(g[k], scale); });
    dx[idx] = sum;
  }
}

// Element k of channel c's M = batch·plane values.
__device__ __forceinline__ size_t channelElement(const BatchNormShape& s, int64_t c, int64_t k) {
  return static_cast<size_t>((k / s.plane * s.channels + c) * s.plane + k % s.plane);
}

__global__ void batchNormForwardKernel(const float* x, const float* weight, const float* bias, float* runningMean,
                                       float* runningVar, float* invStd, float* xhat, float* y, BatchNormShape s,
                                       BatchNormOptions o) {
  const int64_t c = blockIdx.x, m = s.batch * s.plane;
  __shared__ float meanShared, invShared;
  if (o.batchStats) {
    double sum = 0.0;
    for (int64_t k = threadIdx.x; k < m; k += blockDim.x) sum += x[channelElement(s, c, k)];
    const double mean = blockSum(sum) / static_cast<double>(m);
    double sq = 0.0;
    for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
      const double d = x[channelElement(s, c, k)] - mean;
      sq += d * d;
    }
    const double total = blockSum(sq);
    if (threadIdx.x == 0) {
      const double var = total / static_cast<double>(m), unbiased = total / static_cast<double>(m - 1);
      runningMean[c] = static_cast<float>(o.momentum * mean + (1.0 - o.momentum) * runningMean[c]);
      runningVar[c] = static_cast<float>(o.momentum * unbiased + (1.0 - o.momentum) * runningVar[c]);
      meanShared = static_cast<float>(mean);
      invShared = static_cast<float>(1.0 / sqrt(var + o.eps));
      invStd[c] = invShared;
    }
  } else if (threadIdx.x == 0) {
    meanShared = runningMean[c];
    invShared = static_cast<float>(1.0 / sqrt(static_cast<double>(runningVar[c]) + o.eps));
    invStd[c] = invShared;
  }
  __syncthreads();
  const float mean = meanShared, inv = invShared, gamma = weight[c], beta = bias[c];
  for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
    const size_t e = channelElement(s, c, k);
    const float h = (x[e] - mean) * inv;
    xhat[e] = h;
    y[e] = gamma * h + beta;
  }
}

__global__ void batchNormBackwardKernel(const float* dy, const float* xhat, const float* weight, const float* invStd,
                                        float* dweight, float* dbias, float* dx, BatchNormShape s, bool batchStats,
                                        bool accumulate) {
  const int64_t c = blockIdx.x, m = s.batch * s.plane;
  double sumDy = 0.0, sumDyXhat = 0.0;
  for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
    const size_t e = channelElement(s, c, k);
    sumDy += dy[e];
    sumDyXhat += static_cast<double>(dy[e]) * xhat[e];
  }
  sumDy = blockSum(sumDy);
  sumDyXhat = blockSum(sumDyXhat);
  if (threadIdx.x == 0) {
    dweight[c] = static_cast<float>(sumDyXhat) + (accumulate ? dweight[c] : 0.0f);
    dbias[c] = static_cast<float>(sumDy) + (accumulate ? dbias[c] : 0.0f);
  }
  if (!dx) return;
  const float scale = weight[c] * invStd[c];
  const float meanDy = batchStats ? static_cast<float>(sumDy / static_cast<double>(m)) : 0.0f;
  const float meanDyXhat = batchStats ? static_cast<float>(sumDyXhat / static_cast<double>(m)) : 0.0f;
  for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
    const size_t e = channelElement(s, c, k);
    dx[e] = batchStats ? scale * (dy[e] - meanDy - xhat[e] * meanDyXhat) : scale * dy[e];
  }
}

void checkPool(const PoolShape& s) {
  COHORT_CHECK(s.kernel >= 1 && s.stride >= 1 && s.outHeight >= 0 && s.outWidth >= 0 &&
               (s.outHeight == 0 || (s.outHeight - 1) * s.stride + s.kernel <= s.height) &&
               (s.outWidth == 0 || (s.outWidth - 1) * s.stride + s.kernel <= s.width) &&
               s.height * s.width <= INT32_MAX)
      << "pooling geometry: " << s.planes << " planes " << s.height << "x" << s.width << " -> " << s.outHeight << "x"
      << s.outWidth << ", kernel " << s.kernel << " stride " << s.stride;
}

// Checks the geometry and launches `kernel(args..., total)` over `total` elements (nothing when 0).
template <class... Params, class... Args>
void launchPool(void (*kernel)(Params...), const PoolShape& s, size_t total, const Stream& stream, Args... args) {
  checkCudaStream(stream);
  checkPool(s);
  if (total == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(kernel, blocksFor(stream, total), kThreads, 0, nativeStream(stream))(args..., total);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

size_t outputElements(const PoolShape& s) { return static_cast<size_t>(s.planes * s.outHeight * s.outWidth); }
size_t inputElements(const PoolShape& s) { return static_cast<size_t>(s.planes * s.height * s.width); }
float averageScale(const PoolShape& s) { return 1.0f / static_cast<float>(s.kernel * s.kernel); }

}  // namespace

void maxPoolForward(const float* x, float* y, int32_t* argmax, const PoolShape& s, const Stream& stream) {
  launchPool(maxPoolForwardKernel, s, outputElements(s), stream, x, y, argmax, s);
}

void maxPoolBackward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& s, const Stream& stream) {
  launchPool(maxPoolBackwardKernel, s, inputElements(s), stream, dy, argmax, dx, s);
}

void avgPoolForward(const float* x, float* y, const PoolShape& s, const Stream& stream) {
  launchPool(avgPoolForwardKernel, s, outputElements(s), stream, x, y, s, averageScale(s));
}

void avgPoolBackward(const float* dy, float* dx, const PoolShape& s, const Stream& stream) {
  launchPool(avgPoolBackwardKernel, s, inputElements(s), stream, dy, dx, s, averageScale(s));
}

void batchNormForward(const float* x, const float* weight, const float* bias, float* runningMean, float* runningVar,
                      float* invStd, float* xhat, float* y, const BatchNormShape& s, const BatchNormOptions& o,
                      const Stream& stream) {
  checkCudaStream(stream);
  COHORT_CHECK(s.batch >= 0 && s.channels >= 1 && s.plane >= 0 && s.channels <= INT32_MAX)
      << "batch norm of [" << s.batch << ", " << s.channels << ", " << s.plane << "]";
  COHORT_CHECK(!o.batchStats || s.batch * s.plane > 1) << "batch statistics need more than one value per channel";
  CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(batchNormForwardKernel, static_cast<unsigned>(s.channels), kThreads, 0, nativeStream(stream))(
      x, weight, bias, runningMean, runningVar, invStd, xhat, y, s, o);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void batchNormBackward(const float* dy, const float* xhat, const float* weight, const float* invStd, float* dweight,
                       float* dbias, float* dx, const BatchNormShape& s, bool batchStats, bool accumulate,
                       const Stream& stream) {
  checkCudaStream(stream);
  COHORT_CHECK(s.batch >= 0 && s.channels >= 1 && s.plane >= 0 && s.channels <= INT32_MAX)
      << "batch norm of [" << s.batch << ", " << s.channels << ", " << s.plane << "]";
  CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(batchNormBackwardKernel, static_cast<unsigned>(s.channels), kThreads, 0, nativeStream(stream))(
      dy, xhat, weight, invStd, dweight, dbias, dx, s, batchStats, accumulate);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cohort::runtime::cuda
