// ShardedPlacement's checkpoints (train/placement/sharded_placement.h, "Checkpoints").
#include "train/placement/sharded_placement.h"

#include <vector>

namespace cohort::train {

// The optimizer state gathered whole, under the names a replica's checkpoint gives it: the
// whole-model form of the placement's state. Job::save does not use it: a sharded job writes shard
// files (train/checkpoint/sharded_checkpointer.h), which gather nothing.
SavedState ShardedPlacement::saveState() {
  SavedState saved;
  for (const auto& s : optimizer_.state()) saved.tensors.push_back({"optimizer." + s.name, gatherToHost(s.tensor.data())});
  saved.metadata["optimizer_steps"] = std::to_string(optimizer_.steps());
  return saved;
}

// A whole-model checkpoint into a sharded job: every rank reads the whole parameters, packs its
// pieces of them and of each whole state tensor (on a GPU packed on the host, then copied:
// CheckpointReader's copies are blocking), and the units are gathered from the pieces as after an
// update (stage 3 keeps its shard only). A sharded checkpoint is resharded by
// ShardedCheckpointer::load.
void ShardedPlacement::loadState(const CheckpointReader& reader) {
  runtime::Tensor whole = runtime::Tensor::zeros({static_cast<int64_t>(params_.numel())});
  for (const nn::ParamBuffer::Entry& e : params_.entries()) {
    reader.load(e.name, runtime::Tensor::view(whole.data() + e.offset, e.shape));
  }
  runtime::Tensor packed = runtime::Tensor::zeros({static_cast<int64_t>(map_->shardNumel())});
  map_->pack(whole.data(), map_->rank(), packed.data());
  unpackParams(packed.data());
  for (const auto& s : optimizer_.state()) {
    reader.load("optimizer." + s.name, whole);
    map_->pack(whole.data(), map_->rank(), packed.data());
    s.tensor.copyFrom(packed);
  }
  optimizer_.setSteps(reader.count("optimizer_steps"));
  gatherParams();
}

}  // namespace cohort::train
