#include "train/local_strategy.h"

namespace cohort::train {

LocalStrategy::LocalStrategy(const StrategyContext& c) : params_(c.params), optimizer_(c.optimizer), gpu_(c.gpu) {
  c.initialise();
  moveToGpu(params_, gpu_);
}

void LocalStrategy::step(float gradScale) {
  scaleGradients(params_, gradScale, gpu_);
  optimizer_.step(params_.values(), params_.grads());
}

void LocalStrategy::loadState(const CheckpointReader& reader) {
  loadParams(reader, params_);
  loadSingleOptimizerState(reader, optimizer_);
}

}  // namespace cohort::train
