#include "nn/dropout.h"

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
  runtime::ensureShape(mask_, input.shape());
  runtime::ensureShape(output_, input.shape());
  const float scale = 1.0f / (1.0f - p_);
  const float* x = input.data();
  float* m = mask_.data();
  float* y = output_.data();
  for (int64_t i = 0; i < input.numel(); ++i) {
    m[i] = pass.rng->uniform() < p_ ? 0.0f : scale;
    y[i] = x[i] * m[i];
  }
  return output_;
}

const Tensor& Dropout::backward(const Tensor& gradOutput, const Pass& pass) {
  if (!pass.needInputGrad || !active_) {
    gradInput_ = pass.needInputGrad ? gradOutput : Tensor();
    return gradInput_;
  }
  runtime::ensureShape(gradInput_, gradOutput.shape());
  const float* dy = gradOutput.data();
  const float* m = mask_.data();
  float* dx = gradInput_.data();
  for (int64_t i = 0; i < gradOutput.numel(); ++i) dx[i] = dy[i] * m[i];
  return gradInput_;
}

}  // namespace cohort::nn
