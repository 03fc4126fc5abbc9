// Softmax and LogSoftmax over the last dimension. Numerically stable (the row maximum is subtracted
// first). Both keep their output for backward. For classification training prefer the fused
// SoftmaxCrossEntropy loss (nn/loss.h), which never materialises these gradients separately.
// Thread safety: as Module.
#pragma once

#include "nn/module.h"

namespace cohort::nn {

class Softmax final : public Module {
 public:
  explicit Softmax(bool log = false) : log_(log) {}

  std::string name() const override { return log_ ? "LogSoftmax" : "Softmax"; }
  Shape outputShape(const Shape& input) const override { return input; }
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;

 private:
  bool log_;
  Tensor output_;
  Tensor gradInput_;
};

inline ModulePtr logSoftmax() { return std::make_unique<Softmax>(true); }

// Writes softmax (or log-softmax) of each row of x[rows, cols] into y; shared with the fused loss.
void softmaxRows(const float* x, float* y, int64_t rows, int64_t cols, bool log);

}  // namespace cohort::nn
