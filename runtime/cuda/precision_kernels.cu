// fp32 <-> bf16 conversions (runtime/cuda/precision_kernels.h): grid-stride loops, two elements
// per thread and step where both buffers allow 8- and 4-byte pairs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "runtime/cuda/elements.h"
#include "runtime/cuda/launch.h"
#include "runtime/cuda/precision_kernels.h"

namespace cohort::runtime::cuda {
namespace {

using launch::firstIndex;
using launch::gridStride;

// pairs: how many leading (float2, bf16 pair) groups are converted as pairs; the rest one by one.
__global__ void toBf16Kernel(const float* __restrict__ in, __nv_bfloat16* __restrict__ out, size_t n, size_t pairs) {
  for (size_t i = firstIndex(); i < pairs; i += gridStride()) {
    const float2 v = reinterpret_cast<const float2*>(in)[i];
    reinterpret_cast<__nv_bfloat162*>(out)[i] = __floats2bfloat162_rn(v.x, v.y);
  }
  for (size_t i = 2 * pairs + firstIndex(); i < n; i += gridStride()) out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void toFloatKernel(const __nv_bfloat16* __restrict__ in, float* __restrict__ out, size_t n, size_t pairs) {
  for (size_t i = firstIndex(); i < pairs; i += gridStride()) {
    reinterpret_cast<float2*>(out)[i] = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(in)[i]);
  }
  for (size_t i = 2 * pairs + firstIndex(); i < n; i += gridStride()) out[i] = __bfloat162float(in[i]);
}

__global__ void broadcastToBf16Kernel(const float* __restrict__ bias, __nv_bfloat16* __restrict__ out, size_t n,
                                      size_t cols) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) out[i] = __float2bfloat16_rn(bias[i % cols]);
}

// Four elements per access where every buffer allows it (quads), the rest one by one.
template <class T>
__global__ void addMixedKernel(const float* a, const T* b, float* out, size_t n, size_t quads) {
  for (size_t i = firstIndex(); i < quads; i += gridStride()) {
    const float4 x = elements::loadQuad(a, i), y = elements::loadQuad(b, i);
    elements::storeQuad(out, i, make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w));
  }
  for (size_t i = 4 * quads + firstIndex(); i < n; i += gridStride()) out[i] = a[i] + elements::load(b[i]);
}

// Pairs when the float side is 8-byte and the bf16 side 4-byte aligned.
size_t pairsFor(const void* floats, const void* halves, int64_t n) {
  const bool aligned = reinterpret_cast<uintptr_t>(floats) % 8 == 0 && reinterpret_cast<uintptr_t>(halves) % 4 == 0;
  return aligned ? static_cast<size_t>(n / 2) : 0;
}

}  // namespace

void convertToBf16(const float* in, void* out, int64_t n, const Stream& stream) {
  launch::checkCudaStream(stream);
  if (n <= 0) return;
  CudaDeviceGuard guard(stream.device().index);
  const size_t pairs = pairsFor(in, out, n);
  COHORT_LAUNCH(toBf16Kernel, launch::blocksFor(stream, pairs ? pairs : static_cast<size_t>(n)), launch::kThreads, 0,
                launch::nativeStream(stream))(in, static_cast<__nv_bfloat16*>(out), static_cast<size_t>(n), pairs);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void convertToFloat(const void* in, float* out, int64_t n, const Stream& stream) {
  launch::checkCudaStream(stream);
  if (n <= 0) return;
  CudaDeviceGuard guard(stream.device().index);
  const size_t pairs = pairsFor(out, in, n);
  COHORT_LAUNCH(toFloatKernel, launch::blocksFor(stream, pairs ? pairs : static_cast<size_t>(n)), launch::kThreads, 0,
                launch::nativeStream(stream))(static_cast<const __nv_bfloat16*>(in), out, static_cast<size_t>(n), pairs);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void broadcastToBf16(const float* bias, void* out, int64_t rows, int64_t cols, const Stream& stream) {
  COHORT_CHECK(rows >= 0 && cols >= 0) << "broadcastToBf16 of [" << rows << ", " << cols << "]";
  launch::checkCudaStream(stream);
  const size_t n = static_cast<size_t>(rows * cols);
  if (n == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(broadcastToBf16Kernel, launch::blocksFor(stream, n), launch::kThreads, 0, launch::nativeStream(stream))(
      bias, static_cast<__nv_bfloat16*>(out), n, static_cast<size_t>(cols));
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void addMixed(const float* a, const void* b, DType bType, float* out, int64_t n, const Stream& stream) {
  launch::checkCudaStream(stream);
  if (n <= 0) return;
  const size_t count = static_cast<size_t>(n);
  const bool aligned = elements::quadAligned(a, DType::kF32) && elements::quadAligned(b, bType) &&
                       elements::quadAligned(out, DType::kF32);
  const size_t quads = aligned ? count / 4 : 0;
  CudaDeviceGuard guard(stream.device().index);
  const unsigned blocks = launch::blocksFor(stream, quads > 0 ? quads + count % 4 : count);
  elements::dispatch(bType, [&](auto tag) {
    using T = typename decltype(tag)::type;
    COHORT_LAUNCH(addMixedKernel<T>, blocks, launch::kThreads, 0, launch::nativeStream(stream))(
        a, static_cast<const T*>(b), out, count, quads);
  });
  COHORT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cohort::runtime::cuda
