#include "train/local_strategy.h"

namespace cohort::train {

LocalStrategy::LocalStrategy(const PlacementContext& c) : WholeGradientPlacement({c.params, c.optimizer, c.gpu}) {
  c.initialise();
  moveToGpu(c.params, c.gpu);
}

void LocalStrategy::loadState(const CheckpointReader& reader) {
  loadParams(reader, whole_.params);
  loadSingleOptimizerState(reader, whole_.optimizer);
}

}  // namespace cohort::train
