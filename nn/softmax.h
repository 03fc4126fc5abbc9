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
// `causal` (softmax only): the rows are square score matrices [.., T, T] stacked (cols = T), and row
// r sees only columns 0..r mod T: the others get probability 0 (attention's causal mask; Softmax's
// backward is then right as it is, since y = 0 there gives dx = 0).
void softmaxRows(const float* x, float* y, int64_t rows, int64_t cols, bool log, bool causal = false);

}  // namespace cohort::nn
