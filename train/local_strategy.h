// LocalStrategy: one process trains alone (mode local), on the CPU or one GPU: initialises the
// parameters, moves them to the GPU if there is one, and steps the optimizer; collectives are
// trivial. Ownership: borrows the parameters and the optimizer. Thread safety: as Strategy.
#pragma once

#include "train/strategy.h"

namespace cohort::train {

class LocalStrategy final : public Strategy {
 public:
  explicit LocalStrategy(const StrategyContext& context);

  StepResult step(const StepPlan& plan) override;
  void barrier(const std::string&) override {}
  void reduce(std::span<double>, ScalarOp) override {}  // one rank: the values are the job's
  SavedState saveState() override { return singleOptimizerState(optimizer_); }
  void loadState(const CheckpointReader& reader) override;

 private:
  nn::ParamBuffer& params_;
  nn::Optimizer& optimizer_;
  runtime::cuda::GpuContext* gpu_;
  Timeline& timeline_;
};

}  // namespace cohort::train
