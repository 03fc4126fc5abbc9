// Reshaping modules: views of their input with another shape, no copy, no parameters.
//
//   Flatten                  [N, d1, d2, ...] -> [N, d1·d2·...]      (PyTorch's nn.Flatten())
//   Unflatten(sampleShape)   [N, ...]         -> [N, ...sampleShape]  (same element count per sample)
//
// Unflatten lets a CNN take datasets whose samples come flat: Unflatten({1, 28, 28}) views MNIST's
// [N, 784] rows as images. Both return views of the tensors they are given, so the output (and the
// input gradient) is valid as long as the input (or the output gradient) is.
// Thread safety: as Module.
#pragma once

#include "nn/module.h"

namespace cohort::nn {

class Flatten final : public Module {
 public:
  std::string name() const override { return "Flatten"; }
  Shape outputShape(const Shape& input) const override;
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;

 private:
  Shape inputShape_;
  Tensor output_;
  Tensor gradInput_;
};

class Unflatten final : public Module {
 public:
  // Throws InvalidArgument for an empty shape, non-positive sizes, or more than kMaxDims − 1 dims.
  explicit Unflatten(const Shape& sampleShape);

  std::string name() const override { return "Unflatten(" + sampleShape_.str() + ")"; }
  Shape outputShape(const Shape& input) const override;
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;

 private:
  Shape sampleShape_;
  Shape inputShape_;
  Tensor output_;
  Tensor gradInput_;
};

}  // namespace cohort::nn
