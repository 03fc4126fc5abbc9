// Element-wise activations: ReLU, Tanh, Sigmoid. Each keeps its output (which is all its backward
// needs) and returns the same shape it was given. Thread safety: as Module.
#pragma once

#include "nn/module.h"

namespace cohort::nn {

enum class ActivationKind { kRelu, kTanh, kSigmoid };

class Activation final : public Module {
 public:
  explicit Activation(ActivationKind kind) : kind_(kind) {}

  std::string name() const override;
  Shape outputShape(const Shape& input) const override { return input; }
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;

 private:
  ActivationKind kind_;
  Tensor output_;
  Tensor gradInput_;
};

inline ModulePtr relu() { return std::make_unique<Activation>(ActivationKind::kRelu); }
inline ModulePtr tanhActivation() { return std::make_unique<Activation>(ActivationKind::kTanh); }
inline ModulePtr sigmoid() { return std::make_unique<Activation>(ActivationKind::kSigmoid); }

}  // namespace cohort::nn
