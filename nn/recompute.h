// Activation recompute (issue 46, item 2): trade compute for the memory that a forward keeps for its
// backward, as torch.utils.checkpoint does, with results bit for bit those without it.
//
// nn::Recompute wraps any module. In a training pass its forward runs the wrapped module and keeps,
// for itself, only a handle to the input and a copy of the pass's Rng as the forward found it; its
// backward runs the wrapped module's forward again on that input, with a copy of that Rng (so every
// Dropout inside draws the masks it drew the first time: runtime/random.h is counter-based, its
// whole state is (seed, counter)), and then the wrapped module's backward. The recomputed forward is
// the same arithmetic on the same values, so the gradients are the same bits; the pass's own Rng is
// not touched by it, so what is drawn after is the same too. In an evaluation pass (training false)
// the wrapper is the wrapped module and recomputes nothing.
//
// Memory. Cohort's modules own their buffers and reuse them every step (module.h: a steady loop
// allocates nothing), so recompute saves memory only where modules that run one after the other
// share those buffers: what a wrapped module writes in its forward is rewritten by the recompute
// just before its backward reads it, so the buffers of every wrapped module of a chain can be one
// set. The GPT does this (nn/gpt.h, GptOptions::recompute: TransformerBlock::shareForwardBuffers);
// a user's wrapped module keeps its buffers and gains nothing until its layers alias theirs the same
// way, but its results are the same. `selective` (the GPT only) keeps each block and recomputes only
// its cheap parts in backward: docs/sharding.md, "Activation recompute", has both and their figures.
//
// Parameter units (module.h, "Units"). The real forward tells Pass::units about the wrapped
// module's units as it always does. The recomputed forward, which runs inside backward, tells the
// listener beforeBackward(u) where the wrapped module would tell beforeForward(u), and nothing for
// afterForward; the wrapped backward's own beforeBackward(u) is then not repeated, and its
// afterBackward(u) passes through. So each unit hears each event once per forward and backward, and
// beforeBackward(u) comes before anything of the backward reads u's parameters, the recompute
// included: ZeRO-3, which gathers a unit at beforeBackward, has the parameters there for the
// recomputed forward (all the wrapped module's units gathered before its first backward, so wrap
// one unit at a time to keep one gathered). A wrapper inside a declared unit (a GPT block, a layer of
// a Sequential) sees no events of its own: the container tells them around the whole call.
//
// Element types and devices: those of the wrapped module (takesBf16 is its). Gradient accumulation
// and needInputGrad pass through. Contract as Module: the caller keeps the input alive and unchanged
// until backward. Thread safety: as Module.
//
//   auto block = std::make_unique<nn::Recompute>(std::move(mlp));   // any ModulePtr
//   sequential.add(std::move(block), "mlp");
#pragma once

#include <optional>
#include <string>

#include "nn/init_plan.h"
#include "nn/module.h"

namespace cohort::nn {

// What a GPT recomputes in backward instead of keeping from forward (`--recompute`).
enum class RecomputeMode {
  kNone,       // keep everything (the fastest)
  kSelective,  // recompute LayerNorm's and GELU's outputs and the attention's probabilities (CPU)
  kFull,       // keep each block's input only; run the block's forward again in its backward
};

// "none", "selective", "full".
std::string recomputeName(RecomputeMode mode);
// The inverse; InvalidArgument naming the accepted values.
RecomputeMode parseRecompute(const std::string& name);

class Recompute final : public Module, public PlannedInit {
 public:
  // Owns `inner` (not null: InvalidArgument).
  explicit Recompute(ModulePtr inner);
  // Borrows `inner`, which must outlive the wrapper (a composite that keeps its children typed: the GPT).
  explicit Recompute(Module& inner);

  std::string name() const override { return "Recompute(" + inner_->name() + ")"; }
  void registerParams(ParamBuffer& params, const std::string& prefix) override;
  void resetParams(runtime::Rng& rng) override { inner_->resetParams(rng); }
  // The wrapped module's plan; as planChild for one that cannot be planned.
  void planInit(InitPlan& plan) const override;
  Shape outputShape(const Shape& input) const override { return inner_->outputShape(input); }
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;
  bool takesBf16() const override { return inner_->takesBf16(); }
  void checkInputs(const Pass& pass) const override { inner_->checkInputs(pass); }

  Module& inner() { return *inner_; }
  // Forwards run again by backward since construction (tests, the benchmark).
  int64_t recomputations() const { return recomputations_; }

 private:
  ModulePtr owned_;
  Module* inner_;
  size_t firstEntry_ = 0, endEntry_ = 0;  // the wrapped module's parameter entries
  bool kept_ = false;                     // the last forward was a training pass: backward recomputes it
  Tensor input_;                          // a handle to that forward's input
  std::optional<runtime::Rng> rng_;       // Pass::rng as that forward found it (none: the pass had none)
  int64_t recomputations_ = 0;
};

}  // namespace cohort::nn
