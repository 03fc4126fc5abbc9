// LayerNorm: normalisation of every row over the last dimension with a learned affine transform, as
// PyTorch's nn.LayerNorm(features, eps) with elementwise_affine (GPT-2's ln_1, ln_2, ln_f).
//
//   y = weight · (x − mean) · rstd + bias,   rstd = 1 / sqrt(var + eps)
//   mean, var: the row's mean and biased variance over its `features` values
//
// The input is [..., features] with any leading dimensions ([B, T, D], [N, D], [D]); a row is one
// index of the leading dimensions, so training and evaluation compute the same thing (no running
// statistics, no batch dependence). Parameters "weight" (init 1) and "bias" (init 0), both
// [features]. The statistics are summed in double (two passes: the mean, then the squared
// deviations from it) and rounded to float, like BatchNorm2d; the rest is float.
// Forward keeps a handle to its input and, per row, mean and rstd; backward recomputes
// xhat = (x − mean) · rstd from them (the same float expression, so the same bits) and gives
//   dweight = Σ_rows dy · xhat,   dbias = Σ_rows dy,
//   dx = rstd · (g − mean(g) − xhat · mean(g · xhat)),   g = dy · weight.
// CUDA tensors run runtime/cuda/norm_kernels.h's kernels on the pass's stream (agreement with the CPU
// to float32 rounding; the parameter gradients are reduced in a fixed order, so repeated runs give
// the same bits). In a bf16 pass on a GPU (takesBf16) the input may be fp32 or bf16 and the output
// is bf16, ready for the projection that reads it; statistics, parameters and their gradients stay
// fp32, and the input gradient has the input's type (fp32 for GPT's residual stream). Buffers, including the GPU's reduction scratch, are sized per batch shape and
// reused: a steady loop allocates nothing. Thread safety: as Module.
//
//   nn::LayerNorm ln(768);   // ln.registerParams(params, "ln_1."), bind, resetParams, then:
//   const Tensor& y = ln.forward(x, pass);   // x [B, T, 768]
#pragma once

#include <vector>

#include "nn/init_plan.h"
#include "nn/module.h"

namespace cohort::nn {

// The CPU forward of `rows` rows of `features` values, with LayerNorm's arithmetic (the statistics
// in double, the rest in float); each row's mean and rstd go to mean[r] and rstd[r] unless null.
// LayerNorm::forward and nn::GptSampler run it.
void layerNormRows(const float* x, int64_t rows, int64_t features, const float* weight, const float* bias, double eps,
                   float* y, float* mean = nullptr, float* rstd = nullptr);

struct LayerNormOptions {
  int64_t features = 0;
  double eps = 1e-5;
  // false: no "bias" parameter (nanoGPT's bias=False): y = weight · (x − mean) · rstd, the
  // arithmetic of a bias of zeros (which the layer keeps privately, with a gradient it discards).
  bool bias = true;
};

// "Add then normalise": the residual stream's addition fused with the LayerNorm that reads its
// result (TransformerBlock's h = x + attn(…) and ln_2(h)). `sum` is the caller's buffer.
struct ResidualAdd {
  const Tensor& residual;  // fp32, [..., features]
  const Tensor& branch;    // residual's shape and device; fp32, or on a GPU bf16 (widened)
  Tensor& sum;             // written: residual + branch (fp32), the LayerNorm's input
};

// The backward of "add then normalise" on the gradient side: the stream's gradient past the
// LayerNorm plus the LayerNorm's input gradient, written to `out` in one pass on a GPU.
struct ResidualGrad {
  const Tensor* residualGrad = nullptr;  // fp32, the input's shape; null: nothing to add
  // Written: *residualGrad + the input gradient (fp32). Null: the layer's own input-gradient
  // buffer (as backward's), the residual gradient added there.
  Tensor* out = nullptr;
  // A bf16 pass on a GPU: *out rounded once to bf16, for the bf16 product that reads the gradient
  // next (a projection's backward takes it as it is), written by the same kernel; else untouched.
  Tensor* out16 = nullptr;
};

class LayerNorm final : public Module, public PlannedInit {
 public:
  // Throws InvalidArgument for features < 1 or eps <= 0.
  explicit LayerNorm(int64_t features, double eps = 1e-5) : LayerNorm(LayerNormOptions{features, eps}) {}
  explicit LayerNorm(const LayerNormOptions& options);

  std::string name() const override;
  void registerParams(ParamBuffer& params, const std::string& prefix) override;
  // Sets weight 1 and bias 0 (PyTorch's reset_parameters).
  void resetParams(runtime::Rng& rng) override;  // resetByPlan
  void planInit(InitPlan& plan) const override;    // weight 1, bias 0: no draws
  // The input's shape; InvalidArgument unless its last dimension is `features`.
  Shape outputShape(const Shape& input) const override;
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;
  bool takesBf16() const override { return true; }
  // forward(add.residual + add.branch), the sum written to add.sum: on a GPU one kernel
  // (runtime/cuda/norm_kernels.h's fused add), on the CPU addInto then forward (the same bits as
  // the two apart). The LayerNorm keeps a handle on add.sum as its input, for backward.
  const Tensor& forwardAdded(const ResidualAdd& add, const Pass& pass);
  // backward(gradOutput), its input gradient added to *grad.residualGrad and written to *grad.out
  // (and *grad.out16), which is returned: on a GPU one kernel, on the CPU backward then addInto. The
  // pass must ask for the input gradient. The parameter gradients are backward's.
  const Tensor& backwardAdded(const Tensor& gradOutput, const ResidualGrad& grad, const Pass& pass);

  int64_t features() const { return features_; }
  // Aliases this layer's backward-only buffers (the input gradient, the parameter reduction's scratch) to `peer`'s, so that the two hold
  // one set. Only for layers that run backward one after the other and whose input gradient is dead
  // once the next one has run: TransformerBlock::shareBackwardBuffers, which a GPT calls for its
  // blocks. A buffer that must grow is reallocated for this layer alone until it shares again.
  void shareBackwardBuffers(const LayerNorm& peer) {
    gradInput_ = peer.gradInput_;
    scratch_ = peer.scratch_;
  }
  // Recompute (nn/recompute.h): aliases the output to `peer`'s (shareOutput), or everything forward
  // writes, the per-row statistics too (shareForwardBuffers), for layers whose forward runs again
  // before their backward or their output's reader's backward reads it (TransformerBlock's).
  void shareOutput(const LayerNorm& peer) { output_ = peer.output_; }
  void shareForwardBuffers(const LayerNorm& peer) {
    output_ = peer.output_;
    mean_ = peer.mean_;
    rstd_ = peer.rstd_;
  }

  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  // Per row of the last forward: [rows] (rows = input.numel() / features).
  const Tensor& mean() const { return mean_; }
  const Tensor& rstd() const { return rstd_; }

 private:
  const Tensor& forwardGpu(const Pass& pass, const ResidualAdd* add);
  const Tensor& backwardGpu(const Tensor& gradOutput, const Pass& pass, const ResidualGrad& grad);

  // Without a bias parameter: bias_ zeros and biasGrad_ a scratch, on the device of the input.
  void placeZeroBias(const Pass& pass);

  int64_t features_;
  double eps_;
  bool hasBias_ = true;
  Tensor weight_, bias_, weightGrad_, biasGrad_;
  size_t weightEntry_ = InitTarget::kNoEntry, biasEntry_ = InitTarget::kNoEntry;  // in the last registration
  Tensor input_;      // a handle to the last forward's input
  int64_t rows_ = 0;  // of the last forward
  Tensor mean_, rstd_;
  Tensor output_;
  Tensor gradInput_;
  Tensor scratch_;  // GPU only: the per-chunk partial sums of dweight and dbias
  std::vector<double> columnSums_;  // CPU: dweight's and dbias's running sums, [2 · features]
};

}  // namespace cohort::nn
