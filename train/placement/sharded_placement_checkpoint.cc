// ShardedPlacement's checkpoints (train/placement/sharded_placement.h, "Checkpoints").
#include "train/placement/sharded_placement.h"

namespace cohort::train {

// The optimizer state gathered whole, under the names a replica's checkpoint gives it, so that a
// sharded job's checkpoint resumes at any stage and world size (docs/sharding.md, "Checkpoints").
SavedState ShardedPlacement::saveState() {
  SavedState saved;
  for (const auto& s : optimizer_.state()) saved.tensors.push_back({"optimizer." + s.name, gatherToHost(s.tensor.data())});
  saved.metadata["optimizer_steps"] = std::to_string(optimizer_.steps());
  return saved;
}

// Every rank loads the whole parameters and packs its pieces of each whole state tensor (on a GPU
// packed on the host, then copied: CheckpointReader's copies are blocking).
void ShardedPlacement::loadState(const CheckpointReader& reader) {
  loadParams(reader, params_);
  runtime::Tensor whole = runtime::Tensor::zeros({static_cast<int64_t>(params_.numel())});
  runtime::Tensor packed = runtime::Tensor::zeros({static_cast<int64_t>(map_->shardNumel())});
  for (const auto& s : optimizer_.state()) {
    reader.load("optimizer." + s.name, whole);
    map_->pack(whole.data(), map_->rank(), packed.data());
    s.tensor.copyFrom(packed);
  }
  optimizer_.setSteps(reader.count("optimizer_steps"));
}

}  // namespace cohort::train
