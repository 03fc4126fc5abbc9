#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/elements.h"
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/launch.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {
namespace {

constexpr unsigned kThreads = 256;
// Enough resident blocks to fill every SM several times over; grid-stride loops do the rest.
constexpr int kBlocksPerSm = 8;

struct Launch {
  unsigned blocks = 0;
  cudaStream_t stream = nullptr;
};

void checkCudaStream(const Stream& stream) {
  COHORT_CHECK(stream.device().isCuda()) << "CUDA kernel launched on " << stream.describe();
}

// Sizes the grid for `work` items (float4 groups or scalars) on the stream's device, which the
// caller has made current.
Launch launchFor(const Stream& stream, size_t work) {
  int sms = 0;
  COHORT_CUDA_CHECK(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, stream.device().index));
  size_t wanted = (work + kThreads - 1) / kThreads;
  size_t cap = static_cast<size_t>(std::max(sms, 1)) * kBlocksPerSm;
  return {static_cast<unsigned>(std::max<size_t>(1, std::min(wanted, cap))),
          static_cast<cudaStream_t>(stream.native())};
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- sgdStep ----

struct SgdArgs {
  float lr;
  float momentum;
  float weightDecay;
  bool nesterov;
  bool firstStep;
};

__host__ __device__ inline SgdArgs sgdArgs(const SgdStepOptions& o) {
  return {o.lr, o.momentum, o.weightDecay, o.nesterov, o.firstStep};
}

__device__ __forceinline__ void sgdElement(float& p, float g, float& buf, const SgdArgs& a) {
  float d = g;
  if (a.weightDecay != 0.0f) d = d + a.weightDecay * p;
  if (a.momentum != 0.0f) {
    buf = a.firstStep ? d : a.momentum * buf + d;
    d = a.nesterov ? d + a.momentum * buf : buf;
  }
  p = p - a.lr * d;
}

// One run's step (the shard steps' per-piece launches; the whole buffer's is sgdChunksKernel):
// elements [0, 4 * vecCount) as float4, the rest one by one. `buf` is null without momentum.
__global__ void sgdKernel(float* __restrict__ param, const float* __restrict__ grad,
                          float* __restrict__ buf, size_t n, size_t vecCount, SgdArgs a) {
  size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  bool readBuf = buf != nullptr && !a.firstStep;
  for (size_t i = first; i < vecCount; i += stride) {
    float4 p = reinterpret_cast<float4*>(param)[i];
    float4 g = reinterpret_cast<const float4*>(grad)[i];
    float4 b = readBuf ? reinterpret_cast<float4*>(buf)[i] : make_float4(0, 0, 0, 0);
    sgdElement(p.x, g.x, b.x, a);
    sgdElement(p.y, g.y, b.y, a);
    sgdElement(p.z, g.z, b.z, a);
    sgdElement(p.w, g.w, b.w, a);
    reinterpret_cast<float4*>(param)[i] = p;
    if (buf) reinterpret_cast<float4*>(buf)[i] = b;
  }
  for (size_t i = 4 * vecCount + first; i < n; i += stride) {
    float b = readBuf ? buf[i] : 0.0f;
    float p = param[i];
    sgdElement(p, grad[i], b, a);
    param[i] = p;
    if (buf) buf[i] = b;
  }
}

// A multi-tensor SGD step (step_guard.h): block b the chunks b, b + grid, ...; each element as
// sgdKernel's.
__global__ void sgdChunksKernel(SgdChunks b, bool vectorize, const OptimizerStepArgs<SgdStepOptions>* __restrict__ args,
                                const StepControl* __restrict__ control) {
  float mult;
  const launch::StepCount which = launch::chunkArgs(control, args, mult);
  if (which == launch::StepCount::kNone) return;
  auto* half = static_cast<__nv_bfloat16*>(b.half);
  for (int c = blockIdx.x; c < b.chunkCount; c += gridDim.x) {
    const OptimizerChunk chunk = b.chunks[c];
    const SgdArgs a = sgdArgs(launch::rateArgs(args, which, chunk.rate));
    const bool readBuf = b.momentumBuffer != nullptr && !a.firstStep;
    const auto one = [&](size_t i) {
      float buf = readBuf ? b.momentumBuffer[i] : 0.0f;
      float p = b.param[i];
      sgdElement(p, __fmul_rn(b.grad[i], mult), buf, a);
      b.param[i] = p;
      if (b.momentumBuffer) b.momentumBuffer[i] = buf;
      if (half) half[i] = elements::store<__nv_bfloat16>(p);
    };
    const auto quad = [&](size_t q) {
      float4 p = elements::loadQuad(b.param, q);
      const float4 g = elements::loadQuad(b.grad, q);
      float4 buf = readBuf ? elements::loadQuad(b.momentumBuffer, q) : make_float4(0, 0, 0, 0);
      sgdElement(p.x, __fmul_rn(g.x, mult), buf.x, a);
      sgdElement(p.y, __fmul_rn(g.y, mult), buf.y, a);
      sgdElement(p.z, __fmul_rn(g.z, mult), buf.z, a);
      sgdElement(p.w, __fmul_rn(g.w, mult), buf.w, a);
      elements::storeQuad(b.param, q, p);
      if (b.momentumBuffer) elements::storeQuad(b.momentumBuffer, q, buf);
      if (half) elements::storeQuad(half, q, p);
    };
    launch::forChunkElements(chunk, vectorize, one, quad);
  }
}

// ---- fill ----

__global__ void fillKernel(float* __restrict__ data, size_t n, size_t vecCount, float value) {
  size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float4 v = make_float4(value, value, value, value);
  for (size_t i = first; i < vecCount; i += stride) reinterpret_cast<float4*>(data)[i] = v;
  for (size_t i = 4 * vecCount + first; i < n; i += stride) data[i] = value;
}

// ---- scale ----

__global__ void scaleKernel(float* __restrict__ data, size_t n, size_t vecCount, float alpha) {
  size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t i = first; i < vecCount; i += stride) {
    float4 v = reinterpret_cast<float4*>(data)[i];
    v.x *= alpha;
    v.y *= alpha;
    v.z *= alpha;
    v.w *= alpha;
    reinterpret_cast<float4*>(data)[i] = v;
  }
  for (size_t i = 4 * vecCount + first; i < n; i += stride) data[i] *= alpha;
}

// ---- axpy ----

__global__ void axpyKernel(float alpha, const float* __restrict__ x, float* __restrict__ y,
                           size_t n, size_t vecCount) {
  size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t i = first; i < vecCount; i += stride) {
    float4 xv = reinterpret_cast<const float4*>(x)[i];
    float4 yv = reinterpret_cast<float4*>(y)[i];
    yv.x = yv.x + alpha * xv.x;
    yv.y = yv.y + alpha * xv.y;
    yv.z = yv.z + alpha * xv.z;
    yv.w = yv.w + alpha * xv.w;
    reinterpret_cast<float4*>(y)[i] = yv;
  }
  for (size_t i = 4 * vecCount + first; i < n; i += stride) y[i] = y[i] + alpha * x[i];
}

// ---- sumOfSquares ----

constexpr unsigned kSumBlocks = kSumOfSquaresScratch - 1;  // the most blocks sumOfSquares launches
constexpr size_t kMinPerThread = 16;

// Thread t of the grid takes the quads (elements 4q..4q+3 of the span) q = t, t + grid, ..., adding
// each quad's squares in order; the last n % 4 elements go to the threads of the first quads. A
// quad is one 16-byte load where the span is aligned, four loads where it is not: the same additions
// either way, so the bits depend on the values and the length alone. The grid, sized from the length
// alone, gives each thread at least kMinPerThread elements, up to kSumBlocks blocks of kThreads: 8
// blocks on each of an H200's 132 SMs (2048 threads each: full occupancy) from 4M elements on.
__global__ void sumOfSquaresBlocksKernel(const float* __restrict__ data, size_t n, bool aligned,
                                         double* __restrict__ partials) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x, first = launch::firstIndex();
  const size_t quads = n / 4;
  double sum = 0;
  for (size_t q = first; q < quads; q += stride) {
    const float4 v = aligned ? reinterpret_cast<const float4*>(data)[q]
                             : make_float4(data[4 * q], data[4 * q + 1], data[4 * q + 2], data[4 * q + 3]);
    sum += static_cast<double>(v.x) * v.x;
    sum += static_cast<double>(v.y) * v.y;
    sum += static_cast<double>(v.z) * v.z;
    sum += static_cast<double>(v.w) * v.w;
  }
  if (first < n % 4) {
    const double x = data[4 * quads + first];
    sum += x * x;
  }
  const double total = launch::groupReduce<launch::kThreads>(sum, launch::SumOp{});
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void sumPartialsKernel(const double* __restrict__ partials, unsigned count, double* __restrict__ out) {
  double sum = 0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  const double total = launch::blockSum(sum);
  if (threadIdx.x == 0) *out = total;
}

void launchSgd(const SgdBuffers& buffers, const SgdStepOptions& options, const Stream& stream) {
  checkCudaStream(stream);
  size_t n = buffers.param.size();
  COHORT_CHECK_EQ(buffers.grad.size(), n);
  bool useMomentum = options.momentum != 0.0f;
  if (useMomentum) {
    COHORT_CHECK_EQ(buffers.momentumBuffer.size(), n);
  }
  if (n == 0) return;
  float* buf = useMomentum ? buffers.momentumBuffer.data() : nullptr;
  bool vectorize = aligned16(buffers.param.data()) && aligned16(buffers.grad.data()) &&
                   (buf == nullptr || aligned16(buf));
  size_t vecCount = vectorize ? n / 4 : 0;
  CudaDeviceGuard guard(stream.device().index);
  Launch launch = launchFor(stream, vectorize ? vecCount + n % 4 : n);
  COHORT_LAUNCH(sgdKernel, launch.blocks, kThreads, 0, launch.stream)(
      buffers.param.data(), buffers.grad.data(), buf, n, vecCount, sgdArgs(options));
  COHORT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void sgdStep(const SgdChunks& buffers, const OptimizerStepArgs<SgdStepOptions>* args, const StepControl* control,
             const Stream& stream) {
  checkCudaStream(stream);
  COHORT_CHECK(args != nullptr && buffers.chunkCount >= 0) << "a multi-tensor SGD step without its arguments";
  if (buffers.chunkCount == 0) return;
  const bool vectorize = aligned16(buffers.param) && aligned16(buffers.grad) &&
                         (buffers.momentumBuffer == nullptr || aligned16(buffers.momentumBuffer)) &&
                         reinterpret_cast<uintptr_t>(buffers.half) % 8 == 0;
  CudaDeviceGuard guard(stream.device().index);
  const auto blocks = static_cast<unsigned>(std::min<size_t>(static_cast<size_t>(buffers.chunkCount),
                                                             launch::maxBlocks(stream)));
  COHORT_LAUNCH(sgdChunksKernel, blocks, kThreads, 0, static_cast<cudaStream_t>(stream.native()))(buffers, vectorize,
                                                                                                 args, control);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void sgdStep(const SgdBuffers& buffers, const SgdStepOptions& options, const Stream& stream) {
  launchSgd(buffers, options, stream);
}

void fill(std::span<float> data, float value, const Stream& stream) {
  checkCudaStream(stream);
  size_t n = data.size();
  if (n == 0) return;
  size_t vecCount = aligned16(data.data()) ? n / 4 : 0;
  CudaDeviceGuard guard(stream.device().index);
  Launch launch = launchFor(stream, vecCount > 0 ? vecCount + n % 4 : n);
  COHORT_LAUNCH(fillKernel, launch.blocks, kThreads, 0, launch.stream)(data.data(), n, vecCount, value);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void scale(std::span<float> data, float alpha, const Stream& stream) {
  checkCudaStream(stream);
  size_t n = data.size();
  if (n == 0) return;
  size_t vecCount = aligned16(data.data()) ? n / 4 : 0;
  CudaDeviceGuard guard(stream.device().index);
  Launch launch = launchFor(stream, vecCount > 0 ? vecCount + n % 4 : n);
  COHORT_LAUNCH(scaleKernel, launch.blocks, kThreads, 0, launch.stream)(data.data(), n, vecCount, alpha);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void axpy(float alpha, std::span<const float> x, std::span<float> y, const Stream& stream) {
  checkCudaStream(stream);
  size_t n = y.size();
  COHORT_CHECK_EQ(x.size(), n);
  if (n == 0) return;
  size_t vecCount = aligned16(x.data()) && aligned16(y.data()) ? n / 4 : 0;
  CudaDeviceGuard guard(stream.device().index);
  Launch launch = launchFor(stream, vecCount > 0 ? vecCount + n % 4 : n);
  COHORT_LAUNCH(axpyKernel, launch.blocks, kThreads, 0, launch.stream)(alpha, x.data(), y.data(), n, vecCount);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void sumOfSquares(std::span<const float> data, double* scratch, const Stream& stream) {
  checkCudaStream(stream);
  CudaDeviceGuard guard(stream.device().index);
  auto native = static_cast<cudaStream_t>(stream.native());
  const auto blocks = static_cast<unsigned>(
      std::clamp<size_t>((data.size() + kMinPerThread * kThreads - 1) / (kMinPerThread * kThreads), 1, kSumBlocks));
  COHORT_LAUNCH(sumOfSquaresBlocksKernel, blocks, kThreads, 0, native)(data.data(), data.size(),
                                                                     aligned16(data.data()), scratch + 1);
  COHORT_CUDA_CHECK(cudaGetLastError());
  COHORT_LAUNCH(sumPartialsKernel, 1, kThreads, 0, native)(scratch + 1, blocks, scratch);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cohort::runtime::cuda
