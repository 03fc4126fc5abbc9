#include "train/placement/local_placement.h"

namespace cohort::train {

LocalPlacement::LocalPlacement(const PlacementContext& c) : WholeGradientPlacement({c.params, c.optimizer, c.gpu}) {
  c.initialise();
  moveToGpu(c.params, c.gpu);
}

void LocalPlacement::loadState(const CheckpointReader& reader) {
  loadParams(reader, whole_.params);
  loadSingleOptimizerState(reader, whole_.optimizer);
}

}  // namespace cohort::train
