// Gpt: GPT-2's language model (issue 20, item 2), as nanoGPT defines it: token embedding wte
// [V, D] and position embedding wpe [context, D] added, L TransformerBlocks, a final LayerNorm ln_f,
// and an LM head tied to wte (logits = x · wteᵀ; the weight is stored once, as
// "transformer.wte.weight", and gets the gradient of both uses). Parameter names and shapes are
// nanoGPT's ("transformer.wte.weight", "transformer.wpe.weight", "transformer.h.<i>.…" as
// TransformerBlock's, "transformer.ln_f.weight", "transformer.ln_f.bias"), so a checkpoint's
// tensors load into that model.
//
// Input: token ids [B, T] (whole-number floats, T <= context); output: logits [B, T, V].
// resetParams is GPT-2's initialisation: every Linear weight and both embeddings normal(0, 0.02),
// the residual projections (attn.c_proj and mlp.c_proj weights) normal(0, 0.02/√(2L)), biases 0,
// LayerNorms 1 and 0, planned (planInit, nn/init_plan.h) so that a rank can fill its pieces alone.
// Backward: the head's weight gradient dlogitsᵀ·x is written first (or added,
// with Pass::accumulateGrads), then the token embedding's is added to it; the ids get no gradient.
// Parameter units (nn/param_buffer.h, "Units"), in forward order: "transformer.embeddings" (wte
// and wpe), each block "transformer.h.<i>", "transformer.ln_f". The head is tied to wte, so the
// embeddings unit is open for the whole pass: Pass::units hears beforeForward(embeddings) first and
// afterForward(embeddings) after the head's product, last; in backward beforeBackward(embeddings)
// first (the head writes wte's gradient), then ln_f, the blocks from the last to the first, and
// afterBackward(embeddings) last, after the token embedding's gradient has been added: only then is
// wte's gradient final. Backward's afterBackward order is therefore ln_f, h.L-1, ..., h.0,
// embeddings, so the gradient buckets of the later blocks are all-reduced while the earlier blocks'
// backward runs (train/placement/grad_sync.h). GptOptions::recompute changes none of this: a block's
// recomputed forward runs inside its backward, between beforeBackward and afterBackward.
// A padded vocabulary (GptOptions::realVocab, llm.c's 50257 ids in a table of 50304 rows): the
// logits of the ids past the real vocabulary are −inf, so every softmax over them (the loss,
// sampling, predict's distribution) counts only the real ids, and the loss and its gradients are
// those of the unpadded model (the padded columns' gradient is 0, or on the CPU a subnormal below
// 1e-37 from the vectorised exp of −inf; so are the padded rows' of wte's gradient).
// The blocks are chained (TransformerBlock::forwardChained) except with GptOptions::recompute kFull:
// each residual addition between blocks, and the last block's before ln_f, is made by the LayerNorm
// that reads it (one kernel on a GPU), with the same bits as the blocks' own forward.
// CPU and CUDA (the head through oneDNN or cuBLAS). Thread safety: as Module.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/init_plan.h"
#include "nn/layer_norm.h"
#include "nn/module.h"
#include "nn/recompute.h"
#include "nn/transformer_block.h"

namespace cohort::nn {

struct GptOptions {
  int64_t vocab = 256;
  int64_t layers = 1;
  int64_t heads = 1;
  int64_t dim = 64;
  int64_t context = 64;
  // What backward recomputes instead of keeping (nn/recompute.h; docs/sharding.md, "Activation
  // recompute"): kFull wraps each block in nn::Recompute and the blocks share one set of forward
  // buffers, so each keeps only its input; kSelective keeps the blocks and shares, between them, the
  // outputs of both LayerNorms and (CPU) GELU's and the attention's probabilities, written again in
  // backward, and what backward never reads (TransformerBlock::shareSelectiveBuffers). The
  // gradients are the same bits in every mode; only memory and time differ.
  RecomputeMode recompute = RecomputeMode::kNone;
  // The real vocabulary when wte's `vocab` rows pad it (the spec's vocab=V,padded_vocab=P): ids in
  // [realVocab, vocab) get −inf logits. 0 (or vocab): no padding. InvalidArgument past vocab.
  int64_t realVocab = 0;
  // nanoGPT's dropout: in training, after wte + wpe and on each block's two branch outputs (the
  // attention's c_proj and the MLP's c_proj, before they join the residual stream); not on the
  // attention's probabilities (nanoGPT's attn_dropout: not implemented). 0: none. In [0, 1).
  float dropout = 0.0f;
  // false: no biases in the Linears and LayerNorms (nanoGPT's bias=False).
  bool bias = true;
  // The ids a model predicts: realVocab when it pads, else vocab.
  int64_t predictedVocab() const { return realVocab > 0 ? realVocab : vocab; }
};

class Gpt final : public Module, public PlannedInit {
 public:
  // InvalidArgument for a non-positive size or a width that the heads do not divide.
  explicit Gpt(const GptOptions& options);

  std::string name() const override;
  void registerParams(ParamBuffer& params, const std::string& prefix) override;
  void resetParams(runtime::Rng& rng) override;  // resetByPlan
  void planInit(InitPlan& plan) const override;
  // [B, T] -> [B, T, V]; InvalidArgument for another rank or T outside 1..context.
  Shape outputShape(const Shape& input) const override;
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;
  // In a bf16 pass the blocks run in bf16 (TransformerBlock) and ln_f writes bf16 for the head, whose
  // product computes in bf16 with fp32 sums and writes bf16 logits (Model::forward widens them unless
  // the loss reads bf16); the embeddings and the residual stream stay fp32.
  bool takesBf16() const override { return true; }
  // No: the head's backward reads the logits' gradient, ln_f's output and wte, never the logits.
  bool backwardReadsOutput() const override { return false; }

  // The token ids' check (Embedding::checkIds; the positions are the model's own).
  void checkInputs(const Pass& pass) const override;

  const GptOptions& options() const { return options_; }
  // Sets options().recompute; InvalidArgument once a forward has run (the blocks' buffers would be
  // shared, or not, from an earlier mode's forward).
  void setRecompute(RecomputeMode mode);

 private:
  GptOptions options_;
  Embedding wte_, wpe_;
  std::vector<std::unique_ptr<TransformerBlock>> blocks_;
  std::vector<std::unique_ptr<Recompute>> recomputed_;  // kFull: a wrapper per block (borrowing it)
  bool forwardRan_ = false;
  LayerNorm lnF_;
  Dropout drop_;  // after wte + wpe (GptOptions::dropout)
  // The units this model declared (none when a container declared one around it).
  std::optional<ParamBuffer::Unit> embeddingsUnit_, lnFUnit_;
  std::vector<std::optional<ParamBuffer::Unit>> blockUnits_;
  int64_t batch_ = 0, time_ = 0;
  Tensor positions_;   // ids 0..T-1, [T], on the input's device
  Tensor x_;           // wte + wpe, [B, T, D]
  Tensor logits_;      // [B, T, V]
  Tensor gradFinal_;   // d(ln_f output), [B, T, D]
  Tensor gradPositions_;  // Σ over the batch of d(x), [T, D]
  const Tensor* final_ = nullptr;  // ln_f's output of the last forward (its own buffer)
  // bf16 passes: ln_f's output, wte and the logits' gradient in bf16, for the head's products.
  Tensor final16_;    // a handle on ln_f's bf16 output (or on finalCast_)
  Tensor finalCast_;  // ln_f's output in bf16, where it gave fp32
  Tensor wte16_;      // wte rounded, a view into the ParamBuffer's bf16 copy (taken at forward)
  Tensor gradLogits16_;
  ParamBuffer* params_ = nullptr;  // where it registered, and wte's entry there
  size_t wteEntry_ = 0;
  Tensor gradStream16_;  // bf16 passes, chained blocks: the residual stream's gradient between blocks in bf16

  void headForward(const Tensor& f, const Tensor& logits, const Pass& pass);
  void maskPadding(const Tensor& logits, const Pass& pass);
  void headBackward(const Tensor& gradLogits, const Pass& pass);
  void shareBlockBuffers(size_t i, runtime::Device device);
  const Tensor& blocksForward(const Tensor& input, const Pass& pass);
};

}  // namespace cohort::nn
