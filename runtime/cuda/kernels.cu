// The kernels of runtime/cuda/kernels.h (Blas lives in blas.cc).
//
// Launch shapes. Elementwise kernels use kThreads-thread blocks and grid-stride loops over a grid
// capped at kBlocksPerSm blocks per SM, with float4 loads and stores when every buffer is 16-byte
// aligned (a scalar loop finishes the tail), like elementwise.cu. Row kernels (softmax here; the
// cross-entropy's are in cross_entropy_kernels.cu) give each row a row group: a warp when the row
// has at most kWarpRowMaxCols columns, else a whole block. A group combines its threads' partial
// results with warp shuffles (a block adds one pass through shared memory); every thread of the
// group ends with the same bits, and the row loop is uniform over the group, so the shuffles and
// barriers are always reached.
// Precision follows the CPU reference: softmax and the MSE loss accumulate in double as
// nn/softmax.cc and nn/loss.cc do, and each expression keeps the CPU's operation order. Both
// compilers may contract a·b + c into an FMA, which is why the two agree to float32 rounding rather
// than bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/elements.h"
#include "runtime/cuda/launch.h"
#include "runtime/dropout_mask.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {
namespace {

using namespace launch;  // kThreads, blocksFor, firstIndex, RowGroup, groupReduce, ... (launch.h)

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// float4 groups the flat kernels process vectorised: all of n / 4 when every buffer is aligned.
template <class... Buffers>
size_t vecCountFor(size_t n, const Buffers*... buffers) {
  return (aligned16(buffers) && ...) ? n / 4 : 0;
}

// Threads for the flat kernels: one per float4 group plus one per tail element.
size_t flatWork(size_t n, size_t vecCount) { return vecCount > 0 ? vecCount + n % 4 : n; }


// ---- activations ----

__device__ __forceinline__ float activate(ActivationOp op, float x) {
  switch (op) {
    case ActivationOp::kIdentity:
      return x;
    case ActivationOp::kRelu:
      return x > 0.0f ? x : 0.0f;
    case ActivationOp::kTanh:
      return tanhf(x);
    case ActivationOp::kSigmoid:
      return 1.0f / (1.0f + expf(-x));
  }
  return x;
}

// dy · act'(x), expressed through the output y.
__device__ __forceinline__ float activationGrad(ActivationOp op, float y, float dy) {
  switch (op) {
    case ActivationOp::kIdentity:
      return dy;
    case ActivationOp::kRelu:
      return y > 0.0f ? dy : 0.0f;
    case ActivationOp::kTanh:
      return dy * (1.0f - y * y);
    case ActivationOp::kSigmoid:
      return dy * y * (1.0f - y);
  }
  return dy;
}

__device__ __forceinline__ float biasActivate(ActivationOp op, float v, float b) { return activate(op, v + b); }
__device__ __forceinline__ float4 biasActivate(ActivationOp op, float4 v, float4 b) {
  return make_float4(activate(op, v.x + b.x), activate(op, v.y + b.y), activate(op, v.z + b.z),
                     activate(op, v.w + b.w));
}

// y[r, ·] as `units` values of T (float, or float4 when cols % 4 == 0 and the buffers are aligned).
// Block (x, y) covers blockDim.y rows of blockDim.x units, so narrow rows share a block.
template <class T>
__global__ void biasActivationKernel(ActivationOp op, float* y, const float* bias, int64_t rows, int64_t cols,
                                     int64_t units) {
  const T* b = reinterpret_cast<const T*>(bias);
  int64_t rowStride = static_cast<int64_t>(gridDim.y) * blockDim.y;
  int64_t unitStride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < rows; r += rowStride) {
    T* row = reinterpret_cast<T*>(y + r * cols);
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < units; c += unitStride) {
      row[c] = biasActivate(op, row[c], b[c]);
    }
  }
}

// x may equal y.
__global__ void activationForwardKernel(ActivationOp op, const float* x, float* y, size_t n, size_t vecCount) {
  for (size_t i = firstIndex(); i < vecCount; i += gridStride()) {
    float4 v = reinterpret_cast<const float4*>(x)[i];
    reinterpret_cast<float4*>(y)[i] =
        make_float4(activate(op, v.x), activate(op, v.y), activate(op, v.z), activate(op, v.w));
  }
  for (size_t i = 4 * vecCount + firstIndex(); i < n; i += gridStride()) y[i] = activate(op, x[i]);
}

// dy may equal dx.
__global__ void activationBackwardKernel(ActivationOp op, const float* y, const float* dy, float* dx, size_t n,
                                         size_t vecCount) {
  for (size_t i = firstIndex(); i < vecCount; i += gridStride()) {
    float4 yv = reinterpret_cast<const float4*>(y)[i];
    float4 g = reinterpret_cast<const float4*>(dy)[i];
    reinterpret_cast<float4*>(dx)[i] = make_float4(activationGrad(op, yv.x, g.x), activationGrad(op, yv.y, g.y),
                                                   activationGrad(op, yv.z, g.z), activationGrad(op, yv.w, g.w));
  }
  for (size_t i = 4 * vecCount + firstIndex(); i < n; i += gridStride()) dx[i] = activationGrad(op, y[i], dy[i]);
}

// ---- softmax ----

// As nn::softmaxRows: max-subtracted, the exp sum in double. x may equal y. kCausal (not with log):
// row r sees columns 0..r mod cols, the others get 0 (a template parameter, so that the plain
// softmax keeps its registers).
template <unsigned kWidth, bool kCausal>
__global__ void softmaxForwardKernel(const float* x, float* y, int64_t rows, int64_t cols, bool log) {
  using G = RowGroup<kWidth>;
  for (int64_t r = G::firstRow(); r < rows; r += G::rowStride()) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const int64_t valid = kCausal ? r % cols + 1 : cols;
    float mx = -INFINITY;
    for (int64_t c = G::lane(); c < valid; c += kWidth) mx = MaxOp{}(mx, xr[c]);
    mx = groupReduce<kWidth>(mx, MaxOp{});
    double sum = 0.0;
    for (int64_t c = G::lane(); c < valid; c += kWidth) sum += static_cast<double>(expf(xr[c] - mx));
    sum = groupReduce<kWidth>(sum, SumOp{});
    if (log) {
      float lse = mx + static_cast<float>(::log(sum));
      for (int64_t c = G::lane(); c < cols; c += kWidth) yr[c] = xr[c] - lse;
    } else {
      float inv = static_cast<float>(1.0 / sum);
      for (int64_t c = G::lane(); c < cols; c += kWidth) yr[c] = !kCausal || c < valid ? expf(xr[c] - mx) * inv : 0.0f;
    }
  }
}

// As nn::Softmax::backward: the row sum in double. dy may equal dx.
template <unsigned kWidth>
__global__ void softmaxBackwardKernel(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols,
                                      bool log) {
  using G = RowGroup<kWidth>;
  for (int64_t r = G::firstRow(); r < rows; r += G::rowStride()) {
    const float* yr = y + r * cols;
    const float* dyr = dy + r * cols;
    float* dxr = dx + r * cols;
    double s = 0.0;
    for (int64_t c = G::lane(); c < cols; c += kWidth) {
      s += log ? static_cast<double>(dyr[c]) : static_cast<double>(dyr[c]) * yr[c];
    }
    float sum = static_cast<float>(groupReduce<kWidth>(s, SumOp{}));
    for (int64_t c = G::lane(); c < cols; c += kWidth) {
      dxr[c] = log ? dyr[c] - expf(yr[c]) * sum : yr[c] * (dyr[c] - sum);
    }
  }
}

// ---- losses ----

// As nn::MeanSquaredError::forward: grad = scale · d with the caller's scale = 2/n, the squares
// summed in double; each block writes its share to partials[block] (a grid sized from n alone).
__global__ void meanSquaredErrorKernel(const float* __restrict__ out, const float* __restrict__ targets,
                                       float* __restrict__ grad, size_t n, size_t vecCount, float scale,
                                       double* __restrict__ partials) {
  double total = 0.0;
  for (size_t i = firstIndex(); i < vecCount; i += gridStride()) {
    float4 o = reinterpret_cast<const float4*>(out)[i];
    float4 t = reinterpret_cast<const float4*>(targets)[i];
    float4 d = make_float4(o.x - t.x, o.y - t.y, o.z - t.z, o.w - t.w);
    total += static_cast<double>(d.x) * d.x + static_cast<double>(d.y) * d.y + static_cast<double>(d.z) * d.z +
             static_cast<double>(d.w) * d.w;
    reinterpret_cast<float4*>(grad)[i] = make_float4(scale * d.x, scale * d.y, scale * d.z, scale * d.w);
  }
  for (size_t i = 4 * vecCount + firstIndex(); i < n; i += gridStride()) {
    float d = out[i] - targets[i];
    total += static_cast<double>(d) * d;
    grad[i] = scale * d;
  }
  total = groupReduce<kThreads>(total, SumOp{});
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// One block: *lossSum += lossScale · Σ partials, in a fixed order (no atomics).
__global__ void meanSquaredErrorSumKernel(const double* __restrict__ partials, unsigned count, float lossScale,
                                          float* __restrict__ lossSum) {
  double total = 0.0;
  for (unsigned b = threadIdx.x; b < count; b += kThreads) total += partials[b];
  total = blockSum(total);
  if (threadIdx.x == 0) *lossSum += static_cast<float>(total * lossScale);
}

// ---- dropout ----

__device__ __forceinline__ float dropoutMask(uint64_t seed, size_t i, float p, float scale) {
  return dropoutKeep(seed, i, p) ? scale : 0.0f;
}

// x may equal y.
__global__ void dropoutForwardKernel(const float* x, float* y, float* __restrict__ mask, size_t n, size_t vecCount,
                                     float p, float scale, uint64_t seed) {
  for (size_t i = firstIndex(); i < vecCount; i += gridStride()) {
    size_t e = 4 * i;
    float4 m = make_float4(dropoutMask(seed, e, p, scale), dropoutMask(seed, e + 1, p, scale),
                           dropoutMask(seed, e + 2, p, scale), dropoutMask(seed, e + 3, p, scale));
    float4 v = reinterpret_cast<const float4*>(x)[i];
    reinterpret_cast<float4*>(mask)[i] = m;
    reinterpret_cast<float4*>(y)[i] = make_float4(v.x * m.x, v.y * m.y, v.z * m.z, v.w * m.w);
  }
  for (size_t i = 4 * vecCount + firstIndex(); i < n; i += gridStride()) {
    float m = dropoutMask(seed, i, p, scale);
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

// out may equal a or b.
// y[a, c, b, e] = x[a, b, c, e]: one thread per element of y, reading x with stride e.
__global__ void permute0213Kernel(const float* __restrict__ x, float* __restrict__ y, size_t dimB, size_t dimC,
                                  size_t dimE, size_t n) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) {
    const size_t e = i % dimE;
    size_t rest = i / dimE;
    const size_t b = rest % dimB;
    rest /= dimB;
    const size_t c = rest % dimC;
    const size_t a = rest / dimC;
    y[i] = x[((a * dimB + b) * dimC + c) * dimE + e];
  }
}

__global__ void multiplyKernel(const float* a, const float* b, float* out, size_t n, size_t vecCount) {
  for (size_t i = firstIndex(); i < vecCount; i += gridStride()) {
    float4 u = reinterpret_cast<const float4*>(a)[i];
    float4 v = reinterpret_cast<const float4*>(b)[i];
    reinterpret_cast<float4*>(out)[i] = make_float4(u.x * v.x, u.y * v.y, u.z * v.z, u.w * v.w);
  }
  for (size_t i = 4 * vecCount + firstIndex(); i < n; i += gridStride()) out[i] = a[i] * b[i];
}

// ---- Adam ----

// nn/optimizer.cc's Adam::stepRange for one element, in its operation order.
__device__ __forceinline__ void adamElement(float& p, float g, float& m, float& v, const AdamStepOptions& o) {
  float pi = p * o.decay;
  float gi = g + o.coupledWeightDecay * pi;
  float mi = o.beta1 * m + (1.0f - o.beta1) * gi;
  float vi = o.beta2 * v + (1.0f - o.beta2) * gi * gi;
  m = mi;
  v = vi;
  p = pi - o.stepSize * mi / (sqrtf(vi) / o.bc2Sqrt + o.eps);
}

// One run's step (the shard steps' per-piece launches); the whole buffer's is adamChunksKernel.
__global__ void adamKernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ expAvg,
                           float* __restrict__ expAvgSq, size_t n, size_t vecCount, AdamStepOptions o) {
  for (size_t i = firstIndex(); i < vecCount; i += gridStride()) {
    float4 p = reinterpret_cast<float4*>(param)[i];
    float4 g = reinterpret_cast<const float4*>(grad)[i];
    float4 m = reinterpret_cast<float4*>(expAvg)[i];
    float4 v = reinterpret_cast<float4*>(expAvgSq)[i];
    adamElement(p.x, g.x, m.x, v.x, o);
    adamElement(p.y, g.y, m.y, v.y, o);
    adamElement(p.z, g.z, m.z, v.z, o);
    adamElement(p.w, g.w, m.w, v.w, o);
    reinterpret_cast<float4*>(param)[i] = p;
    reinterpret_cast<float4*>(expAvg)[i] = m;
    reinterpret_cast<float4*>(expAvgSq)[i] = v;
  }
  for (size_t i = 4 * vecCount + firstIndex(); i < n; i += gridStride()) {
    float p = param[i], m = expAvg[i], v = expAvgSq[i];
    adamElement(p, grad[i], m, v, o);
    param[i] = p;
    expAvg[i] = m;
    expAvgSq[i] = v;
  }
}

// A multi-tensor Adam step (step_guard.h): block b the chunks b, b + grid, ...; each element as
// adamKernel's.
__global__ void adamChunksKernel(AdamChunks b, bool vectorize, const OptimizerStepArgs<AdamStepOptions>* __restrict__ args,
                                 const StepControl* __restrict__ control) {
  float mult;
  const StepCount which = chunkArgs(control, args, mult);
  if (which == StepCount::kNone) return;
  auto* half = static_cast<__nv_bfloat16*>(b.half);
  for (int c = blockIdx.x; c < b.chunkCount; c += gridDim.x) {
    const OptimizerChunk chunk = b.chunks[c];
    const AdamStepOptions o = rateArgs(args, which, chunk.rate);
    const auto one = [&](size_t i) {
      float p = b.param[i], m = b.expAvg[i], v = b.expAvgSq[i];
      adamElement(p, __fmul_rn(b.grad[i], mult), m, v, o);
      b.param[i] = p;
      b.expAvg[i] = m;
      b.expAvgSq[i] = v;
      if (half) half[i] = elements::store<__nv_bfloat16>(p);
    };
    const auto quad = [&](size_t q) {
      float4 p = elements::loadQuad(b.param, q), m = elements::loadQuad(b.expAvg, q), v = elements::loadQuad(b.expAvgSq, q);
      const float4 g = elements::loadQuad(b.grad, q);
      adamElement(p.x, __fmul_rn(g.x, mult), m.x, v.x, o);
      adamElement(p.y, __fmul_rn(g.y, mult), m.y, v.y, o);
      adamElement(p.z, __fmul_rn(g.z, mult), m.z, v.z, o);
      adamElement(p.w, __fmul_rn(g.w, mult), m.w, v.w, o);
      elements::storeQuad(b.param, q, p);
      elements::storeQuad(b.expAvg, q, m);
      elements::storeQuad(b.expAvgSq, q, v);
      if (half) elements::storeQuad(half, q, p);
    };
    forChunkElements(chunk, vectorize, one, quad);
  }
}

void checkMatrix(int64_t rows, int64_t cols) {
  COHORT_CHECK(rows >= 0 && cols >= 0) << "matrix of " << rows << " x " << cols;
}


}  // namespace

void biasActivation(ActivationOp op, float* y, const float* bias, int64_t rows, int64_t cols, const Stream& stream) {
  checkCudaStream(stream);
  checkMatrix(rows, cols);
  if (bias == nullptr) {
    activationForward(op, y, y, rows * cols, stream);
    return;
  }
  if (rows == 0 || cols == 0) return;
  bool vectorize = cols % 4 == 0 && aligned16(y) && aligned16(bias);
  int64_t units = vectorize ? cols / 4 : cols;
  CudaDeviceGuard guard(stream.device().index);
  // Whole warps across a row's units (up to the block), the block's remaining threads down rows.
  unsigned tx = static_cast<unsigned>(std::min<int64_t>(kThreads, (units + kWarpSize - 1) / kWarpSize * kWarpSize));
  dim3 block(tx, kThreads / tx);
  size_t cap = maxBlocks(stream);
  unsigned gx = blocksFor(stream, static_cast<size_t>(units), block.x);
  size_t gyCap = std::clamp<size_t>(cap / gx, 1, 65535);  // 65535: CUDA's limit on gridDim.y
  unsigned gy =
      static_cast<unsigned>(std::clamp<size_t>((static_cast<size_t>(rows) + block.y - 1) / block.y, 1, gyCap));
  if (vectorize) {
    COHORT_LAUNCH(biasActivationKernel<float4>, dim3(gx, gy), block, 0, nativeStream(stream))(op, y, bias, rows, cols, units);
  } else {
    COHORT_LAUNCH(biasActivationKernel<float>, dim3(gx, gy), block, 0, nativeStream(stream))(op, y, bias, rows, cols, units);
  }
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void activationForward(ActivationOp op, const float* x, float* y, int64_t n, const Stream& stream) {
  checkCudaStream(stream);
  COHORT_CHECK(n >= 0) << n;
  if (n == 0 || (op == ActivationOp::kIdentity && x == y)) return;
  size_t count = static_cast<size_t>(n);
  size_t vecCount = vecCountFor(count, x, y);
  CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(activationForwardKernel, blocksFor(stream, flatWork(count, vecCount)), kThreads, 0, nativeStream(stream))(
      op, x, y, count, vecCount);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void activationBackward(ActivationOp op, const float* y, const float* dy, float* dx, int64_t n, const Stream& stream) {
  checkCudaStream(stream);
  COHORT_CHECK(n >= 0) << n;
  if (n == 0) return;
  size_t count = static_cast<size_t>(n);
  size_t vecCount = vecCountFor(count, y, dy, dx);
  CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(activationBackwardKernel, blocksFor(stream, flatWork(count, vecCount)), kThreads, 0, nativeStream(stream))(
      op, y, dy, dx, count, vecCount);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void softmaxForward(const float* x, float* y, int64_t rows, int64_t cols, bool log, const Stream& stream,
                    bool causal) {
  checkCudaStream(stream);
  checkMatrix(rows, cols);
  COHORT_CHECK(!(log && causal)) << "a causal log-softmax is not defined here";
  if (rows == 0 || cols == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  unsigned blocks = rowBlocks(stream, rows, cols);
  const cudaStream_t s = nativeStream(stream);
  if (warpPerRow(cols) && causal) {
    COHORT_LAUNCH((softmaxForwardKernel<kWarpSize, true>), blocks, kThreads, 0, s)(x, y, rows, cols, log);
  } else if (warpPerRow(cols)) {
    COHORT_LAUNCH((softmaxForwardKernel<kWarpSize, false>), blocks, kThreads, 0, s)(x, y, rows, cols, log);
  } else if (causal) {
    COHORT_LAUNCH((softmaxForwardKernel<kThreads, true>), blocks, kThreads, 0, s)(x, y, rows, cols, log);
  } else {
    COHORT_LAUNCH((softmaxForwardKernel<kThreads, false>), blocks, kThreads, 0, s)(x, y, rows, cols, log);
  }
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void softmaxBackward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols, bool log,
                     const Stream& stream) {
  checkCudaStream(stream);
  checkMatrix(rows, cols);
  if (rows == 0 || cols == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  unsigned blocks = rowBlocks(stream, rows, cols);
  if (warpPerRow(cols)) {
    COHORT_LAUNCH(softmaxBackwardKernel<kWarpSize>, blocks, kThreads, 0, nativeStream(stream))(y, dy, dx, rows, cols, log);
  } else {
    COHORT_LAUNCH(softmaxBackwardKernel<kThreads>, blocks, kThreads, 0, nativeStream(stream))(y, dy, dx, rows, cols, log);
  }
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void dropoutForward(const float* x, float* y, float* mask, int64_t n, float p, uint64_t seed, const Stream& stream) {
  checkCudaStream(stream);
  COHORT_CHECK(n >= 0) << n;
  COHORT_CHECK(p >= 0.0f && p < 1.0f) << "dropout probability " << p;
  if (n == 0) return;
  size_t count = static_cast<size_t>(n);
  size_t vecCount = vecCountFor(count, x, y, mask);
  const float scale = 1.0f / (1.0f - p);  // as nn/dropout.cc
  CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(dropoutForwardKernel, blocksFor(stream, flatWork(count, vecCount)), kThreads, 0, nativeStream(stream))(
      x, y, mask, count, vecCount, p, scale, seed);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void permute0213(const float* x, float* y, int64_t a, int64_t b, int64_t c, int64_t e, const Stream& stream) {
  checkCudaStream(stream);
  COHORT_CHECK(a >= 0 && b >= 0 && c >= 0 && e >= 0) << a << "x" << b << "x" << c << "x" << e;
  const size_t n = static_cast<size_t>(a) * b * c * e;
  if (n == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(permute0213Kernel, blocksFor(stream, n), kThreads, 0, nativeStream(stream))(
      x, y, static_cast<size_t>(b), static_cast<size_t>(c), static_cast<size_t>(e), n);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void multiply(const float* a, const float* b, float* out, int64_t n, const Stream& stream) {
  checkCudaStream(stream);
  COHORT_CHECK(n >= 0) << n;
  if (n == 0) return;
  size_t count = static_cast<size_t>(n);
  size_t vecCount = vecCountFor(count, a, b, out);
  CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(multiplyKernel, blocksFor(stream, flatWork(count, vecCount)), kThreads, 0, nativeStream(stream))(a, b, out, count,
                                                                                                      vecCount);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void meanSquaredError(const MseBuffers& b, int64_t n, float lossScale, const Stream& stream) {
  checkCudaStream(stream);
  COHORT_CHECK(n >= 0) << n;
  if (n == 0) return;
  size_t count = static_cast<size_t>(n);
  size_t vecCount = vecCountFor(count, b.out, b.targets, b.grad);
  const float scale = 2.0f / static_cast<float>(n);  // as nn/loss.cc
  const size_t work = flatWork(count, vecCount);
  const auto blocks = static_cast<unsigned>(std::min<size_t>((work + kThreads - 1) / kThreads, kMseScratchDoubles));
  CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(meanSquaredErrorKernel, blocks, kThreads, 0, nativeStream(stream))(
      b.out, b.targets, b.grad, count, vecCount, scale, b.scratch);
  COHORT_CUDA_CHECK(cudaGetLastError());
  COHORT_LAUNCH(meanSquaredErrorSumKernel, 1, kThreads, 0, nativeStream(stream))(b.scratch, blocks, lossScale,
                                                                                  b.lossSum);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void adamStep(float* param, const float* grad, float* expAvg, float* expAvgSq, int64_t n,
              const AdamStepOptions& options, const Stream& stream) {
  checkCudaStream(stream);
  COHORT_CHECK(n >= 0) << n;
  if (n == 0) return;
  size_t count = static_cast<size_t>(n);
  size_t vecCount = vecCountFor(count, param, grad, expAvg, expAvgSq);
  CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(adamKernel, blocksFor(stream, flatWork(count, vecCount)), kThreads, 0, nativeStream(stream))(
      param, grad, expAvg, expAvgSq, count, vecCount, options);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void adamStep(const AdamChunks& b, const OptimizerStepArgs<AdamStepOptions>* args, const StepControl* control,
              const Stream& stream) {
  checkCudaStream(stream);
  COHORT_CHECK(args != nullptr && b.chunkCount >= 0) << "a multi-tensor Adam step without its arguments";
  if (b.chunkCount == 0) return;
  const bool vectorize = vecCountFor(4, b.param, b.grad, b.expAvg, b.expAvgSq) > 0 &&
                         reinterpret_cast<uintptr_t>(b.half) % 8 == 0;
  CudaDeviceGuard guard(stream.device().index);
  const auto blocks = static_cast<unsigned>(std::min<size_t>(static_cast<size_t>(b.chunkCount), maxBlocks(stream)));
  COHORT_LAUNCH(adamChunksKernel, blocks, kThreads, 0, nativeStream(stream))(b, vectorize, args, control);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cohort::runtime::cuda
