#include "nn/dropout.h"

#include "nn/gpu_dispatch.h"
#include "runtime/dropout_mask.h"
#include "runtime/error.h"

namespace cohort::nn {

Dropout::Dropout(float p) : p_(p) {
  if (!(p >= 0.0f && p < 1.0f)) COHORT_THROW(InvalidArgument) << "dropout probability must be in [0, 1), got " << p;
}

std::string Dropout::name() const { return "Dropout(" + std::to_string(p_).substr(0, 4) + ")"; }

const Tensor& Dropout::forward(const Tensor& input, const Pass& pass) {
  active_ = pass.training && p_ > 0.0f;
  if (!active_) {
    input_ = input;
    return input_;
  }
  COHORT_CHECK(pass.rng != nullptr) << "Dropout in training needs Pass::rng";
  // One draw from the pass's Rng seeds the whole mask (runtime/dropout_mask.h), so the CPU and the
  // GPU draw the same mask and a resumed run reproduces it from the Rng state.
  const uint64_t seed = pass.rng->nextU64();
#ifdef COHORT_HAVE_CUDA
  if (onGpu(input)) {
    auto& gpu = gpuFor(pass, input, name());
    runtime::ensureShape(mask_, input.shape(), gpu.allocator());
    runtime::ensureShape(output_, input.shape(), gpu.allocator());
    runtime::cuda::dropoutForward(input.data(), output_.data(), mask_.data(), input.numel(), p_, seed, gpu.stream());
    return output_;
  }
#endif
  runtime::ensureShape(mask_, input.shape());
  runtime::ensureShape(output_, input.shape());
  const float scale = 1.0f / (1.0f - p_);
  const float* x = input.data();
  float* m = mask_.data();
  float* y = output_.data();
  for (int64_t i = 0; i < input.numel(); ++i) {
    m[i] = runtime::dropoutKeep(seed, static_cast<uint64_t>(i), p_) ? scale : 0.0f;
    y[i] = x[i] * m[i];
  }
  return output_;
}

const Tensor& Dropout::backward(const Tensor& gradOutput, const Pass& pass) {
  if (!pass.needInputGrad || !active_) {
    gradInput_ = pass.needInputGrad ? gradOutput : Tensor();
    return gradInput_;
  }
#ifdef COHORT_HAVE_CUDA
  if (onGpu(gradOutput)) {
    auto& gpu = gpuFor(pass, gradOutput, name());
    runtime::ensureShape(gradInput_, gradOutput.shape(), gpu.allocator());
    runtime::cuda::multiply(gradOutput.data(), mask_.data(), gradInput_.data(), gradOutput.numel(), gpu.stream());
    return gradInput_;
  }
#endif
  runtime::ensureShape(gradInput_, gradOutput.shape());
  const float* dy = gradOutput.data();
  const float* m = mask_.data();
  float* dx = gradInput_.data();
  for (int64_t i = 0; i < gradOutput.numel(); ++i) dx[i] = dy[i] * m[i];
  return gradInput_;
}

}  // namespace cohort::nn
