#include "nn/activation.h"

#include <cmath>

#include "runtime/error.h"

namespace cohort::nn {

std::string Activation::name() const {
  switch (kind_) {
    case ActivationKind::kRelu: return "ReLU";
    case ActivationKind::kTanh: return "Tanh";
    case ActivationKind::kSigmoid: return "Sigmoid";
  }
  return "?";
}

const Tensor& Activation::forward(const Tensor& input, const Pass& pass) {
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
