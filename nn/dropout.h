// Dropout(p): in training, zeroes each element with probability p and scales the rest by 1/(1-p)
// (PyTorch's inverted dropout); in evaluation, the identity. The mask comes from Pass::rng, so a run
// with the same seed (and a resumed run, whose Rng state is checkpointed) draws the same masks.
// Thread safety: as Module.
#pragma once

#include "nn/module.h"

namespace cohort::nn {

class Dropout final : public Module {
 public:
  explicit Dropout(float p);

  std::string name() const override;
  Shape outputShape(const Shape& input) const override { return input; }
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;

 private:
  float p_;
  bool active_ = false;  // last forward was a training pass with p > 0
  Tensor input_;         // eval passes return the input itself
  Tensor mask_;          // 0 or 1/(1-p) per element
  Tensor output_;
  Tensor gradInput_;
};

}  // namespace cohort::nn
