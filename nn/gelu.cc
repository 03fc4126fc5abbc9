#include "nn/gelu.h"

#include <cmath>

#include "nn/gpu_dispatch.h"
#include "nn/precision.h"
#include "runtime/cpu/blas.h"
#include "runtime/cpu/vector_math.h"
#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/norm_kernels.h"
#endif

namespace cohort::nn {
namespace {

// The constants of PyTorch's tanh approximation (aten/src/ATen/native/cpu/Activation.cpp).
constexpr float kSqrt2OverPi = 0.7978845608028654f;  // √(2/π)
constexpr float kCubic = 0.044715f;

}  // namespace

const Tensor& Gelu::forward(const Tensor& input, const Pass& pass) {
  input_ = input;
#ifdef COHORT_HAVE_CUDA
  if (onGpu(input)) {
    auto& gpu = gpuFor(pass, input, name());
    runtime::ensureShape(output_, input.shape(), gpu.allocator(), input.dtype());
    runtime::cuda::geluForward(input.raw(), output_.raw(), input.numel(), gpu.stream(), input.dtype());
    return output_;
  }
#endif
  precision::checkCpuPrecision(pass, *this);
  runtime::ensureShape(output_, input.shape());
  geluForward(input.data(), output_.data(), input.numel());
  return output_;
}

void geluForward(const float* x, float* y, int64_t n) {
  runtime::cpu::parallelRange(n, runtime::cpu::kParallelGrain, [&](int64_t first, int64_t last, int) {
    for (int64_t i = first; i < last; ++i) {
      const float v = x[i];
      const float t = runtime::cpu::tanhVectorised(kSqrt2OverPi * (v + kCubic * v * v * v));
      y[i] = 0.5f * v * (1.0f + t);
    }
  });
}

const Tensor& Gelu::backward(const Tensor& gradOutput, const Pass& pass) {
  COHORT_CHECK(gradOutput.numel() == input_.numel()) << gradOutput.shape().str() << " vs " << input_.shape().str();
  if (!pass.needInputGrad) {
    gradInput_ = Tensor();
    return gradInput_;
  }
#ifdef COHORT_HAVE_CUDA
  if (onGpu(gradOutput)) {
    auto& gpu = gpuFor(pass, gradOutput, name());
    runtime::ensureShape(gradInput_, input_.shape(), gpu.allocator(), input_.dtype());
    runtime::cuda::geluBackward(input_.raw(), gradOutput.raw(), gradInput_.raw(), input_.numel(), gpu.stream(),
                                input_.dtype(), gradOutput.dtype());
    return gradInput_;
  }
#endif
  runtime::ensureShape(gradInput_, input_.shape());
  geluBackward(input_.data(), gradOutput.data(), gradInput_.data(), input_.numel());
  return gradInput_;
}

void geluBackward(const float* x, const float* dy, float* dx, int64_t n) {
  runtime::cpu::parallelRange(n, runtime::cpu::kParallelGrain, [&](int64_t first, int64_t last, int) {
    for (int64_t i = first; i < last; ++i) {
      const float v = x[i];
      const float t = runtime::cpu::tanhVectorised(kSqrt2OverPi * (v + kCubic * v * v * v));
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * v * v);  // du/dx
      dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
  });
}

}  // namespace cohort::nn
