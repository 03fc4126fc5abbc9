// TransformerBlock: GPT-2's pre-norm residual block (issue 20), as nanoGPT's Block:
//
//   h   = x + attn(ln_1(x))
//   out = h + mlp(ln_2(h)),   mlp(u) = c_proj(gelu(c_fc(u)))   (c_fc: D -> 4D, c_proj: 4D -> D)
//
// with nanoGPT's parameter names under the block's prefix: "ln_1.weight", "ln_1.bias",
// "attn.c_attn.weight" [3D, D], "attn.c_attn.bias", "attn.c_proj.weight" [D, D], "attn.c_proj.bias",
// "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight" [4D, D], "mlp.c_fc.bias", "mlp.c_proj.weight"
// [D, 4D], "mlp.c_proj.bias". Input and output [B, T, D]. resetParams gives each part its own
// default (LayerNorm 1 and 0, Linear PyTorch's uniform); GPT-2's initialisation is the model's to
// apply. Backward: dh = dout + ln_2'(mlp'(dout)), dx = dh + ln_1'(attn'(dh)); every part's
// parameter gradients come whether or not the input gradient is asked for. CPU and CUDA, through
// the parts' own paths: the first addition and ln_2 as LayerNorm::forwardAdded ("add then
// normalise", one kernel on a GPU), the second as Residual's addInto; in backward both additions
// as LayerNorm::backwardAdded (ln_2's with dh's bf16 copy in a bf16 pass). Thread safety: as Module.
#pragma once

#include "nn/attention.h"
#include "nn/dropout.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/recompute.h"

namespace cohort::nn {

struct TransformerBlockOptions {
  AttentionOptions attention = {};  // its bias also the MLP's and the LayerNorms' (nanoGPT's bias)
  // nanoGPT's resid_dropout and the MLP's dropout: in training, each branch's output (attn.c_proj's,
  // mlp.c_proj's) through Dropout(p) before it joins the residual stream. 0: none.
  float dropout = 0.0f;
};

// A block's input in GPT's chain of blocks: a tensor, or the addition the block before left open
// (TransformerBlock::forwardChained), which ln_1 makes while normalising.
struct BlockInput {
  const Tensor* x = nullptr;
  const ResidualAdd* add = nullptr;
};

// A block's output gradient in the chain: fp32, and its bf16 copy when the kernel that wrote it
// wrote one (the next block's ln_1, GPT's ln_f); gradInput16, when given, receives the input
// gradient's bf16 copy in a bf16 pass on a GPU, for the block before. grad16 may be gradInput16:
// the copy is read before the block writes its own.
struct BlockGrad {
  const Tensor* grad = nullptr;
  const Tensor* grad16 = nullptr;
  Tensor* gradInput16 = nullptr;
};

class TransformerBlock final : public Module, public PlannedInit {
 public:
  // InvalidArgument as CausalSelfAttention's (dim a positive multiple of heads), or as Dropout's.
  explicit TransformerBlock(const AttentionOptions& options) : TransformerBlock(TransformerBlockOptions{options}) {}
  explicit TransformerBlock(const TransformerBlockOptions& options);

  std::string name() const override;
  void registerParams(ParamBuffer& params, const std::string& prefix) override;
  void resetParams(runtime::Rng& rng) override;  // resetByPlan
  void planInit(InitPlan& plan) const override;    // its layers' plans, in forward order
  Shape outputShape(const Shape& input) const override { return attn_.outputShape(input); }
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;

  // GPT's chain of blocks (nn::Gpt): the residual stream's additions between blocks made by the
  // LayerNorm that reads their result ("add then normalise", one kernel on a GPU). forwardChained
  // is forward but for its ends: its input may arrive as an addition (BlockInput::add, made by
  // ln_1 into add.sum), and it leaves its own output's addition h + mlp(…) to the reader, naming it
  // (into the block's output buffer) for the next block's forwardChained or a LayerNorm's
  // forwardAdded; backwardChained is backward with the bf16 copies of BlockGrad. forward and
  // backward are these with a tensor at each end. The same bits as forward and backward.
  ResidualAdd forwardChained(const BlockInput& input, const Pass& pass);
  const Tensor& backwardChained(const BlockGrad& grad, const Pass& pass);

  CausalSelfAttention& attn() { return attn_; }
  // Aliases every backward-only buffer of the block and its layers to `peer`'s (a block of the same
  // shape), input gradient included: a GPT runs its blocks' backward one after another, and block
  // i's input gradient, which block i − 1 reads as its output gradient, is dead before that block
  // writes its own (the last thing its backward does). So the blocks of a GPT hold one set of
  // gradient buffers between them instead of one each (about 48 bytes per activation and layer in
  // bf16). Handles only: nothing is allocated or copied.
  void shareBackwardBuffers(const TransformerBlock& peer);
  // Recompute (nn/recompute.h). shareForwardBuffers aliases every buffer the block's forward
  // writes, but its output, to `peer`'s: for `full`, where each block's forward runs again right
  // before its backward (nn::Recompute), so the blocks of a GPT hold one set of them and each keeps
  // only its output (the next block's input). shareSelectiveBuffers aliases what a `selective`
  // backward writes again (both LayerNorms' outputs; on the CPU GELU's output and the attention's
  // probabilities) and what no backward reads (the two output projections' outputs, added into the
  // stream at once; on the CPU c_attn's output and y per head). On a GPU the GELU may be the
  // product's epilogue, whose bits a separate kernel need not give, and the fused attention keeps
  // q, k, v in c_attn's output and no probabilities. Handles only.
  void shareForwardBuffers(const TransformerBlock& peer);
  void shareSelectiveBuffers(const TransformerBlock& peer, runtime::Device device);
  // With kSelective, backward recomputes what shareSelectiveBuffers shares, just before the part of
  // the backward that reads it; kNone and kFull (which the wrapper does) change nothing here.
  void setRecompute(RecomputeMode mode) { recompute_ = mode; }
  // In a bf16 pass (GPU) the four projections compute in bf16, and the activations between the
  // block's layers are bf16 (LayerNorm's and GELU's outputs, the attention core's input and output);
  // the residual stream stays fp32, as do LayerNorm's statistics and every sum inside the kernels.
  // Input and output are fp32.
  bool takesBf16() const override { return true; }
  Linear& mlpFc() { return fc_; }
  Linear& mlpProjection() { return mlpProj_; }

 private:
  AttentionOptions options_;
  LayerNorm ln1_;
  CausalSelfAttention attn_;
  LayerNorm ln2_;
  Linear fc_;  // with the GELU
  Linear mlpProj_;
  bool dropout_ = false;
  Dropout attnDrop_, mlpDrop_;
  Tensor attnCast_, mlpCast_;  // bf16 passes with dropout: the branch outputs in fp32
  RecomputeMode recompute_ = RecomputeMode::kNone;
  Tensor h_, output_, gradH_, gradInput_;
  Tensor gradH16_;  // bf16 passes on a GPU: gradH_ in bf16, written with it, for attn.c_proj's backward
  Tensor input_;  // kSelective: the last forward's input (ln_1's, kept by it too), for the recompute
  // bf16 passes: fp32 copies of a bf16 input or output gradient (from a bf16 layer around the block).
  Tensor inputCast_, gradOutputCast_;
};

}  // namespace cohort::nn
