// Linear: y = x · Wᵀ + b, with W of shape [out, in] and b of shape [out] (PyTorch's layout and
// default initialisation: both uniform in ±1/sqrt(in)). Input [batch, in] (or any shape whose last
// dimension is `in`, flattened over the leading ones). CPU through OpenBLAS GEMM; on a GPU cuBLAS, with
// the bias gradient from runtime/cuda/reduce_kernels.h (repeatable bit for bit). On a GPU the bias
// (and, with `gelu`, the GELU) is applied inside the product's kernel by a cuBLASLt epilogue
// (Blas::gemmFused), or by a kernel of its own after it where cuBLASLt has no algorithm for the shape.
//
// With options.gelu the layer is Linear then GELU (nn::Gelu's tanh approximation) as one:
// y = GELU(x · Wᵀ + b), keeping the pre-activation x · Wᵀ + b for backward; GPT's MLP uses it, so
// its first projection and the GELU are one kernel, and its second projection's backward can apply
// GELU's derivative in its own epilogue (backwardThroughGelu, backwardFromPreActivation).
// Keeps a handle to its input for backward (no copy). Thread safety: as Module.
#pragma once

#include "nn/init_plan.h"
#include "nn/module.h"

namespace cohort::runtime::cuda {
class GpuContext;  // runtime/cuda/gpu_context.h
}  // namespace cohort::runtime::cuda

namespace cohort::nn {

struct LinearOptions {
  int64_t in = 0;
  int64_t out = 0;
  bool bias = true;
  bool gelu = false;  // y = GELU(x · Wᵀ + b)
};

class Linear final : public Module, public PlannedInit {
 public:
  explicit Linear(const LinearOptions& options);
  Linear(int64_t in, int64_t out) : Linear(LinearOptions{in, out, true}) {}

  std::string name() const override;
  void registerParams(ParamBuffer& params, const std::string& prefix) override;
  void resetParams(runtime::Rng& rng) override;  // resetByPlan
  void planInit(InitPlan& plan) const override;    // weight, then bias, uniform in ±1/sqrt(in)
  Shape outputShape(const Shape& input) const override;
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;
  // For a layer whose input is GELU(u) with u a GELU Linear's preActivation(): backward, with the
  // input gradient taken through that GELU, dU = (dY · W) · GELU'(u), fused into the product on a
  // GPU where cuBLASLt can. The GELU Linear then takes dU through backwardFromPreActivation.
  const Tensor& backwardThroughGelu(const Tensor& gradOutput, const Pass& pass, const Tensor& geluInput);
  // A GELU Linear's backward from the gradient with respect to its pre-activation (the GELU's
  // derivative already applied, by backwardThroughGelu).
  const Tensor& backwardFromPreActivation(const Tensor& gradPreActivation, const Pass& pass);
  // A GELU Linear's last forward's x · Wᵀ + b (empty for the others).
  const Tensor& preActivation() const { return preActivation_; }
  // bf16 passes on a GPU (docs/architecture.md): the weight and bias read rounded to bf16 from the
  // ParamBuffer's bf16 copy (param_buffer.h, "The bf16 copy"; none of its own), the
  // products on tensor cores with fp32 accumulation, the output and input gradient in bf16, the
  // weight and bias gradients in fp32. So it declares its weight and bias read as bf16
  // (ParamBuffer::declareReadAsBf16): a sharded bf16 job gathers them in bf16.
  bool takesBf16() const override { return true; }

  // Aliases this layer's backward-only buffers (the input gradient, the incoming gradient's bf16 copy, the bias reduction's scratch) to `peer`'s, so that the two hold
  // one set. Only for layers that run backward one after the other and whose input gradient is dead
  // once the next one has run: TransformerBlock::shareBackwardBuffers, which a GPT calls for its
  // blocks. A buffer that must grow is reallocated for this layer alone until it shares again.
  void shareBackwardBuffers(const Linear& peer);
  // Recompute (nn/recompute.h): aliases the output to `peer`'s (shareOutput: a GELU Linear's GELU
  // output, which recomputeGelu writes again), or everything forward writes (shareForwardBuffers:
  // the output, the pre-activation and a bf16 pass's input copy), for layers whose forward runs again
  // before their backward (TransformerBlock::shareForwardBuffers).
  void shareOutput(const Linear& peer) { output_ = peer.output_; }
  void shareForwardBuffers(const Linear& peer);
  // A GELU Linear on the CPU: writes GELU(preActivation()) into the output again, the forward's own
  // arithmetic (the same bits), for a reader whose backward needs it after another layer's forward
  // overwrote it (shareOutput). InvalidArgument for a Linear without GELU or on a GPU, whose forward
  // may compute the GELU in the product's epilogue.
  const Tensor& recomputeGelu();

  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  const Tensor& weightGrad() const { return weightGrad_; }
  const Tensor& biasGrad() const { return biasGrad_; }
  // The parameters as an InitPlan addresses them (a GPT plans its Linears' weights its own way).
  // Throw InvalidArgument before registerParams; biasTarget() also for a Linear without a bias.
  InitTarget weightTarget() const;
  InitTarget biasTarget() const;

 private:
  LinearOptions options_;
  Tensor weight_, bias_, weightGrad_, biasGrad_;
  size_t weightEntry_ = InitTarget::kNoEntry, biasEntry_ = InitTarget::kNoEntry;  // in the last registration
  Tensor input_;       // last forward's input, viewed as [rows, in]
  Shape inputShape_;   // its shape as given
  Tensor output_;
  Tensor preActivation_;  // GELU Linear: x · Wᵀ + b, the GELU's input
  Tensor gradInput_;
  Tensor gradPreActivation_;  // GELU Linear: the gradient through the GELU
  Tensor biasScratch_;  // GPU only: the bias gradient's partial sums, or the epilogue's sum to add
  ParamBuffer* params_ = nullptr;  // where it registered: bf16 passes read its bf16 copy
  // bf16 passes: the weight rounded to bf16, a view into the ParamBuffer's bf16 copy (taken at
  // forward, read again by backward), and the bf16 copies of an fp32 input or output gradient.
  Tensor weight16_, inputCast_, gradCast_;

  void forwardCpu(const Shape& outShape);
  const Tensor& forwardGpu(const Tensor& input2d, const Shape& outShape, const Pass& pass);
  const Tensor& backwardWith(const Tensor& gradOutput, const Pass& pass, const Tensor* geluInput);
  const Tensor& geluBackward(const Tensor& gradOutput, const Tensor& geluInput, const Pass& pass);
  const Tensor& backwardBf16(const Tensor& gradOutput, const Pass& pass, const Tensor* geluInput);
  const Tensor& backwardFp32(const Tensor& gradOutput, const Pass& pass, const Tensor* geluInput);
  void inputGradGpu(runtime::cuda::GpuContext& gpu, const Tensor& dy, const void* w, runtime::DType type,
                    const Tensor* geluInput);
  void biasGradGpu(runtime::cuda::GpuContext& gpu, const Tensor& dy, const Pass& pass);
  void paramGradsGpu(runtime::cuda::GpuContext& gpu, const Tensor& dy, const Pass& pass);
};

}  // namespace cohort::nn
