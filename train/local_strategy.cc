#include "train/local_strategy.h"

namespace cohort::train {

LocalStrategy::LocalStrategy(const StrategyContext& c)
    : params_(c.params), optimizer_(c.optimizer), gpu_(c.gpu), timeline_(c.timeline) {
  c.initialise();
  moveToGpu(params_, gpu_);
}

StepResult LocalStrategy::step(const StepPlan& plan) {
  return stepWholeGradient(plan, LossVerdict::own(plan.loss, 0), 0, params_, optimizer_, gpu_, timeline_);
}

void LocalStrategy::loadState(const CheckpointReader& reader) {
  loadParams(reader, params_);
  loadSingleOptimizerState(reader, optimizer_);
}

}  // namespace cohort::train
