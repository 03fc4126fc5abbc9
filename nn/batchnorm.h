// BatchNorm2d: per-channel batch normalisation of NCHW input with a learned affine transform, as
// PyTorch's nn.BatchNorm2d(channels, eps, momentum) with affine and track_running_stats on.
//
//   training:   y = weight · (x − mean_B) / sqrt(var_B + eps) + bias
//               mean_B, var_B: the batch's mean and biased variance over N·H·W per channel;
//               running_mean ← (1 − momentum) · running_mean + momentum · mean_B
//               running_var  ← (1 − momentum) · running_var  + momentum · var_B · M / (M − 1)
//               (M = N·H·W: the running variance takes the unbiased estimate; computed in double
//               and rounded to float, like PyTorch's CPU kernel)
//   evaluation: the same with running_mean and running_var in place of the batch statistics.
//
// Parameters "weight" (init 1) and "bias" (init 0); non-trainable buffers "running_mean" (0) and
// "running_var" (1) registered with ParamBuffer::addBuffer, so checkpoints carry them. Training
// needs M > 1 (InvalidArgument otherwise, as PyTorch). PyTorch's num_batches_tracked is not kept:
// it only matters for momentum = None (a cumulative average), which is not offered.
// CUDA tensors run the same arithmetic in runtime/cuda/kernels.h's batch-norm kernels on the pass's
// stream (running statistics updated on the device; agreement with the CPU to float32 rounding).
// Buffers are sized per batch shape and reused: a steady loop allocates nothing.
// Keeps the normalised input for backward. Thread safety: as Module.
#pragma once

#include "nn/init_plan.h"
#include "nn/module.h"

namespace cohort::nn {

class BatchNorm2d final : public Module, public PlannedInit {
 public:
  // Throws InvalidArgument for channels < 1, eps <= 0 or momentum outside [0, 1].
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1);

  std::string name() const override;
  void registerParams(ParamBuffer& params, const std::string& prefix) override;
  // Sets weight 1, bias 0, running_mean 0, running_var 1 (PyTorch's reset_parameters): the plan
  // (weight 1, bias 0, no draws), then the statistics. A piecewise initialisation fills the
  // parameters only: the statistics keep the values binding gives them, which are the same.
  void resetParams(runtime::Rng& rng) override;
  void planInit(InitPlan& plan) const override;
  Shape outputShape(const Shape& input) const override;
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;

  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  const Tensor& runningMean() const { return runningMean_; }
  const Tensor& runningVar() const { return runningVar_; }

 private:
  const Tensor& forwardGpu(const Tensor& input, const Pass& pass);
  const Tensor& backwardGpu(const Tensor& gradOutput, const Pass& pass);

  int64_t channels_;
  double eps_, momentum_;
  Tensor weight_, bias_, weightGrad_, biasGrad_;
  size_t weightEntry_ = InitTarget::kNoEntry, biasEntry_ = InitTarget::kNoEntry;  // in the last registration
  Tensor runningMean_, runningVar_;
  bool batchStats_ = false;  // the last forward normalised with the batch's statistics
  Shape inputShape_;
  Tensor normalized_;  // (x − mean) / sqrt(var + eps) of the last forward
  Tensor invStd_;      // [C]: 1 / sqrt(var + eps) of the last forward
  Tensor output_;
  Tensor gradInput_;
};

}  // namespace cohort::nn
