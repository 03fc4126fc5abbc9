// 2-D pooling over NCHW float32 input: MaxPool2d and AvgPool2d, square windows of `kernel` taken
// every `stride` (default: kernel) elements, no padding, windows that do not fit dropped (PyTorch's
// defaults, ceil_mode = false). Input [N, C, H, W] with H, W >= kernel; output [N, C, OH, OW] with
// OH = (H − kernel) / stride + 1 (rounded down), likewise OW.
//
// MaxPool2d remembers, per output element, where in its window the maximum was (the first one in
// row-major order on ties, as PyTorch's CPU kernel), and backward routes the gradient there only;
// where windows overlap (kernel > stride) an input collects the gradients of every window it won.
// AvgPool2d spreads each output gradient evenly over its window.
// CUDA tensors run the same arithmetic in runtime/cuda/kernels.h's pooling kernels on the pass's
// stream (the same results bit for bit, ties included).
// Buffers are sized per batch shape and reused: a steady loop allocates nothing.
// Thread safety: as Module.
#pragma once

#include <vector>

#include "nn/module.h"

namespace cohort::nn {

// Window geometry shared by the pooling modules.
class Pool2dBase : public Module {
 public:
  Shape outputShape(const Shape& input) const override;

 protected:
  // Throws InvalidArgument unless kernel >= 1 and stride >= 0 (0: stride = kernel).
  Pool2dBase(const char* kind, int64_t kernel, int64_t stride);
  std::string describe(const char* kind) const;

  int64_t kernel_, stride_;
  Shape inputShape_;
};

class MaxPool2d final : public Pool2dBase {
 public:
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0) : Pool2dBase("MaxPool2d", kernel, stride) {}

  std::string name() const override { return describe("MaxPool2d"); }
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;

 private:
  Tensor output_;
  Tensor gradInput_;
  std::vector<int32_t> argmax_;  // per output element: the winner's offset within its input plane
  Tensor gpuArgmax_;             // the same on a GPU: int32 values in a buffer of as many floats
};

class AvgPool2d final : public Pool2dBase {
 public:
  explicit AvgPool2d(int64_t kernel, int64_t stride = 0) : Pool2dBase("AvgPool2d", kernel, stride) {}

  std::string name() const override { return describe("AvgPool2d"); }
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;

 private:
  Tensor output_;
  Tensor gradInput_;
};

}  // namespace cohort::nn
