// Gelu: the Gaussian error linear unit in the tanh approximation GPT-2 uses, element-wise,
// exactly PyTorch's gelu(x, approximate='tanh'):
//
//   y = 0.5 · x · (1 + tanh(u)),   u = √(2/π) · (x + 0.044715 · x³)
//   dy/dx = 0.5 · (1 + tanh(u)) + 0.5 · x · (1 − tanh²(u)) · √(2/π) · (1 + 3 · 0.044715 · x²)
//
// Any shape; the output has the input's. No parameters. Unlike ReLU or Tanh the derivative cannot be
// recovered from the output, so forward keeps a handle to its input (no copy; the caller keeps it
// alive and unchanged until backward, as module.h says). CUDA tensors run runtime/cuda/norm_kernels.h's
// geluForward/geluBackward on the pass's stream (agreement with the CPU to float32 rounding: both
// compute in float, with their own tanh). In a bf16 pass on a GPU (takesBf16) the output has the
// input's type (bf16 after a bf16 projection, as in GPT's MLP) and so has the input gradient; the
// arithmetic is fp32. Buffers are sized per batch shape and reused.
// Thread safety: as Module.
//
//   nn::Sequential mlp;
//   mlp.add(std::make_unique<nn::Linear>(768, 3072), "fc").add(nn::gelu(), "gelu");
#pragma once

#include "nn/module.h"

namespace cohort::nn {

class Gelu final : public Module {
 public:
  std::string name() const override { return "GELU(tanh)"; }
  Shape outputShape(const Shape& input) const override { return input; }
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;
  bool takesBf16() const override { return true; }
  // Aliases this layer's backward-only buffers (the input gradient) to `peer`'s, so that the two hold
  // one set. Only for layers that run backward one after the other and whose input gradient is dead
  // once the next one has run: TransformerBlock::shareBackwardBuffers, which a GPT calls for its
  // blocks. A buffer that must grow is reallocated for this layer alone until it shares again.
  void shareBackwardBuffers(const Gelu& peer) { gradInput_ = peer.gradInput_; }

 private:
  Tensor input_;  // a handle to the last forward's input
  Tensor output_;
  Tensor gradInput_;
};

inline ModulePtr gelu() { return std::make_unique<Gelu>(); }

// The CPU forward of n values: y = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), vectorised;
// y may be x (in place). Gelu::forward and nn::GptSampler run it.
void geluForward(const float* x, float* y, int64_t n);
// The CPU backward of n values: dx = dy · GELU'(x); dx may be dy. Gelu::backward and a Linear with
// a GELU (linear.h) run it.
void geluBackward(const float* x, const float* dy, float* dx, int64_t n);

}  // namespace cohort::nn
