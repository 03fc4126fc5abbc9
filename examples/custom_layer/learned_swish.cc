#include "examples/custom_layer/learned_swish.h"

#include <cmath>

namespace example {

void LearnedSwish::registerParams(cohort::nn::ParamBuffer& params, const std::string& prefix) {
  params.add(prefix + "beta", Shape{features_}, &beta_, &betaGrad_);
}

void LearnedSwish::resetParams(cohort::runtime::Rng&) { beta_.fill(1.0f); }

Shape LearnedSwish::outputShape(const Shape& input) const {
  if (input.rank() != 2 || input[1] != features_) {
    COHORT_THROW(InvalidArgument) << name() << " takes [batch, " << features_ << "], got " << input.str();
  }
  return input;
}

const Tensor& LearnedSwish::forward(const Tensor& x, const Pass&) {
  if (x.device().isCuda()) COHORT_THROW(InvalidArgument) << name() << " runs on the CPU only";
  outputShape(x.shape());
  x_ = x;  // a handle, no copy: backward needs the input
  cohort::runtime::ensureShape(sig_, x.shape());
  cohort::runtime::ensureShape(y_, x.shape());
  const int64_t rows = x.dim(0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t f = 0; f < features_; ++f) {
      const int64_t i = r * features_ + f;
      const float s = 1.0f / (1.0f + std::exp(-beta_.at(f) * x.at(i)));
      sig_.at(i) = s;
      y_.at(i) = x.at(i) * s;
    }
  }
  return y_;
}

// y = x·s with s = σ(βx):  dy/dx = s + x·s(1−s)·β,  dy/dβ = x·s(1−s)·x.
const Tensor& LearnedSwish::backward(const Tensor& dy, const Pass& pass) {
  const int64_t rows = x_.dim(0);
  if (!pass.accumulateGrads) betaGrad_.fill(0.0f);
  if (pass.needInputGrad) cohort::runtime::ensureShape(dx_, x_.shape());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t f = 0; f < features_; ++f) {
      const int64_t i = r * features_ + f;
      const float x = x_.at(i), s = sig_.at(i), ds = s * (1.0f - s);
      betaGrad_.at(f) += dy.at(i) * x * ds * x;
      if (pass.needInputGrad) dx_.at(i) = dy.at(i) * (s + x * ds * beta_.at(f));
    }
  }
  if (!pass.needInputGrad) return none_;
  return dx_;
}

}  // namespace example
