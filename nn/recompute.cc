#include "nn/recompute.h"

#include "runtime/error.h"

namespace cohort::nn {

namespace {

// The listener of the recomputed forward: its beforeForward(u) is the backward's beforeBackward(u)
// (the parameters are needed from here on), its afterForward(u) is nothing.
class RecomputeForwardUnits final : public UnitListener {
 public:
  explicit RecomputeForwardUnits(UnitListener& outer) : outer_(outer) {}
  void beforeForward(const ParamBuffer::Unit& unit) override { outer_.beforeBackward(unit); }

 private:
  UnitListener& outer_;
};

// The listener of the wrapped backward: beforeBackward(u) was told by the recompute already.
class RecomputeBackwardUnits final : public UnitListener {
 public:
  explicit RecomputeBackwardUnits(UnitListener& outer) : outer_(outer) {}
  void afterBackward(const ParamBuffer::Unit& unit) override { outer_.afterBackward(unit); }

 private:
  UnitListener& outer_;
};

}  // namespace

std::string recomputeName(RecomputeMode mode) {
  switch (mode) {
    case RecomputeMode::kNone:
      return "none";
    case RecomputeMode::kSelective:
      return "selective";
    case RecomputeMode::kFull:
      return "full";
  }
  return "none";
}

RecomputeMode parseRecompute(const std::string& name) {
  for (RecomputeMode m : {RecomputeMode::kNone, RecomputeMode::kSelective, RecomputeMode::kFull}) {
    if (name == recomputeName(m)) return m;
  }
  COHORT_THROW(InvalidArgument) << "recompute must be none, selective or full, got '" << name << "'";
}

Recompute::Recompute(ModulePtr inner) : owned_(std::move(inner)), inner_(owned_.get()) {
  if (!inner_) COHORT_THROW(InvalidArgument) << "nn::Recompute needs a module to wrap, got none";
}

Recompute::Recompute(Module& inner) : inner_(&inner) {}

void Recompute::registerParams(ParamBuffer& params, const std::string& prefix) {
  firstEntry_ = params.entries().size();
  inner_->registerParams(params, prefix);
  endEntry_ = params.entries().size();
}

void Recompute::planInit(InitPlan& plan) const { planChild(*inner_, firstEntry_, endEntry_, plan); }

const Tensor& Recompute::forward(const Tensor& input, const Pass& pass) {
  kept_ = pass.training;
  if (kept_) {
    input_ = input;
    rng_.reset();
    if (pass.rng) rng_ = *pass.rng;
  } else {
    input_ = Tensor();
  }
  return inner_->forward(input, pass);
}

const Tensor& Recompute::backward(const Tensor& gradOutput, const Pass& pass) {
  if (!kept_) return inner_->backward(gradOutput, pass);  // an evaluation forward kept everything
  COHORT_CHECK(input_.defined()) << name() << ": backward without a training forward";
  std::optional<runtime::Rng> replay = rng_;
  Pass again = pass;
  again.rng = replay ? &*replay : nullptr;
  std::optional<RecomputeForwardUnits> forwardUnits;
  std::optional<RecomputeBackwardUnits> backwardUnits;
  if (pass.units) {
    again.units = &forwardUnits.emplace(*pass.units);
    backwardUnits.emplace(*pass.units);
  }
  inner_->forward(input_, again);
  ++recomputations_;
  Pass back = pass;
  if (pass.units) back.units = &*backwardUnits;
  return inner_->backward(gradOutput, back);
}

}  // namespace cohort::nn
