// fp32 <-> bf16 conversions and the mixed residual add (runtime/cuda/precision_kernels.h):
// grid-stride loops, four elements per access where every buffer is aligned to that (elements.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "runtime/cuda/elements.h"
#include "runtime/cuda/launch.h"
#include "runtime/cuda/precision_kernels.h"

namespace cohort::runtime::cuda {
namespace {

using launch::firstIndex;
using launch::gridStride;

// out = in, converted element by element (elements.h: widened exactly, or rounded once); the first
// 4 · quads elements four at a time.
template <class TIn, class TOut>
__global__ void convertKernel(const TIn* __restrict__ in, TOut* __restrict__ out, size_t n, size_t quads) {
  for (size_t i = firstIndex(); i < quads; i += gridStride()) elements::storeQuad(out, i, elements::loadQuad(in, i));
  for (size_t i = 4 * quads + firstIndex(); i < n; i += gridStride()) {
    out[i] = elements::store<TOut>(elements::load(in[i]));
  }
}

__global__ void broadcastToBf16Kernel(const float* __restrict__ bias, __nv_bfloat16* __restrict__ out, size_t n,
                                      size_t cols) {
  for (size_t i = firstIndex(); i < n; i += gridStride()) out[i] = __float2bfloat16_rn(bias[i % cols]);
}

template <class T>
__global__ void fillColumnsKernel(T* __restrict__ data, size_t n, size_t width, size_t cols, size_t firstCol, float value) {
  const T v = elements::store<T>(value);
  for (size_t i = firstIndex(); i < n; i += gridStride()) data[(i / width) * cols + firstCol + i % width] = v;
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

template <class TIn, class TOut>
void convert(const void* in, void* out, int64_t n, const Stream& stream) {
  launch::checkCudaStream(stream);
  if (n <= 0) return;
  CudaDeviceGuard guard(stream.device().index);
  const size_t count = static_cast<size_t>(n);
  const size_t quads = elements::quadsFor(count, {{in, elements::dtypeOf<TIn>()}, {out, elements::dtypeOf<TOut>()}});
  COHORT_LAUNCH((convertKernel<TIn, TOut>), launch::blocksFor(stream, quads > 0 ? quads + count % 4 : count),
                launch::kThreads, 0, launch::nativeStream(stream))(static_cast<const TIn*>(in), static_cast<TOut*>(out),
                                                                   count, quads);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void convertToBf16(const float* in, void* out, int64_t n, const Stream& stream) {
  convert<float, __nv_bfloat16>(in, out, n, stream);
}

void convertToFloat(const void* in, float* out, int64_t n, const Stream& stream) {
  convert<__nv_bfloat16, float>(in, out, n, stream);
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

void fillColumns(void* data, DType type, int64_t rows, int64_t cols, int64_t firstCol, float value,
                 const Stream& stream) {
  COHORT_CHECK(rows >= 0 && 0 <= firstCol && firstCol <= cols)
      << "fillColumns of columns " << firstCol << ".. of [" << rows << ", " << cols << "]";
  launch::checkCudaStream(stream);
  const size_t width = static_cast<size_t>(cols - firstCol), n = static_cast<size_t>(rows) * width;
  if (n == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  elements::dispatch(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    COHORT_LAUNCH(fillColumnsKernel<T>, launch::blocksFor(stream, n), launch::kThreads, 0, launch::nativeStream(stream))(
        static_cast<T*>(data), n, width, static_cast<size_t>(cols), static_cast<size_t>(firstCol), value);
  });
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void addMixed(const float* a, const void* b, DType bType, float* out, int64_t n, const Stream& stream) {
  launch::checkCudaStream(stream);
  if (n <= 0) return;
  const size_t count = static_cast<size_t>(n);
  const size_t quads = elements::quadsFor(count, {{a, DType::kF32}, {b, bType}, {out, DType::kF32}});
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
