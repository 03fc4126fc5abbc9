// LearnedSwish: y = x · sigmoid(β ⊙ x), with one learnable β per feature (Swish with a trainable
// slope, initialised to 1) — a user-defined layer, written against the Module contract of
// nn/module.h alone. Input [batch, features]; output the same shape. CPU only: a CUDA tensor is
// refused with InvalidArgument. Its gradient check is learned_swish_test.cc.
// Thread safety: as Module (one thread at a time).
#pragma once

#include <string>

#include "cohort/cohort.h"

namespace example {

using cohort::nn::Pass;
using cohort::nn::Shape;
using cohort::nn::Tensor;

class LearnedSwish final : public cohort::nn::Module {
 public:
  explicit LearnedSwish(int64_t features) : features_(features) {}

  std::string name() const override { return "LearnedSwish(" + std::to_string(features_) + ")"; }
  void registerParams(cohort::nn::ParamBuffer& params, const std::string& prefix) override;
  void resetParams(cohort::runtime::Rng& rng) override;
  Shape outputShape(const Shape& input) const override;
  const Tensor& forward(const Tensor& x, const Pass& pass) override;
  const Tensor& backward(const Tensor& dy, const Pass& pass) override;

 private:
  int64_t features_;
  Tensor beta_, betaGrad_;   // [features], views into the model's ParamBuffer
  Tensor x_, sig_, y_, dx_;  // the input and sigmoid(βx) kept for backward; owned outputs
  Tensor none_;              // returned when no input gradient is asked for
};

}  // namespace example
