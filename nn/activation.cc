#include "nn/activation.h"

#include <cmath>

#include "nn/gpu_dispatch.h"
#include "runtime/error.h"

namespace cohort::nn {

#ifdef COHORT_HAVE_CUDA
namespace {
runtime::cuda::ActivationOp gpuOp(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::kRelu: return runtime::cuda::ActivationOp::kRelu;
    case ActivationKind::kTanh: return runtime::cuda::ActivationOp::kTanh;
    case ActivationKind::kSigmoid: return runtime::cuda::ActivationOp::kSigmoid;
  }
  return runtime::cuda::ActivationOp::kIdentity;
}
}  // namespace
#endif

std::string Activation::name() const {
  switch (kind_) {
    case ActivationKind::kRelu: return "ReLU";
    case ActivationKind::kTanh: return "Tanh";
    case ActivationKind::kSigmoid: return "Sigmoid";
  }
  return "?";
}

const Tensor& Activation::forward(const Tensor& input, const Pass& pass) {
#ifdef COHORT_HAVE_CUDA
  if (onGpu(input)) {
    auto& gpu = gpuFor(pass, input, name());
    runtime::ensureShape(output_, input.shape(), gpu.allocator());
    runtime::cuda::activationForward(gpuOp(kind_), input.data(), output_.data(), input.numel(), gpu.stream());
    return output_;
  }
#endif
  runtime::ensureShape(output_, input.shape());
  const float* x = input.data();
  float* y = output_.data();
  int64_t n = input.numel();
  switch (kind_) {
    case ActivationKind::kRelu:
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
      break;
    case ActivationKind::kTanh:
      for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
      break;
    case ActivationKind::kSigmoid:
      for (int64_t i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + std::exp(-x[i]));
      break;
  }
  return output_;
}

const Tensor& Activation::backward(const Tensor& gradOutput, const Pass& pass) {
  COHORT_CHECK(gradOutput.numel() == output_.numel()) << gradOutput.shape().str() << " vs " << output_.shape().str();
  if (!pass.needInputGrad) {
    gradInput_ = Tensor();
    return gradInput_;
  }
#ifdef COHORT_HAVE_CUDA
  if (onGpu(gradOutput)) {
    auto& gpu = gpuFor(pass, gradOutput, name());
    runtime::ensureShape(gradInput_, output_.shape(), gpu.allocator());
    runtime::cuda::activationBackward(gpuOp(kind_), output_.data(), gradOutput.data(), gradInput_.data(),
                                      output_.numel(), gpu.stream());
    return gradInput_;
  }
#endif
  runtime::ensureShape(gradInput_, output_.shape());
  const float* y = output_.data();
  const float* dy = gradOutput.data();
  float* dx = gradInput_.data();
  int64_t n = output_.numel();
  switch (kind_) {
    case ActivationKind::kRelu:
      for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
      break;
    case ActivationKind::kTanh:
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
      break;
    case ActivationKind::kSigmoid:
      for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * y[i] * (1.0f - y[i]);
      break;
  }
  return gradInput_;
}

}  // namespace cohort::nn
