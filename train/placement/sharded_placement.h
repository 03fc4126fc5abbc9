// ShardedPlacement: mode allreduce with ZeRO's sharding (docs/sharding.md): the ranks of the shard
// group (the job's, or each node's with scope node) each keep only their shard of the optimizer
// state (stage 1) and of the averaged gradient (stage 2), over an nn::ShardMap of the model's
// parameter units. Its stages of the one step (train/placement/placement.h):
//   reduceGradients  the loss vote starts on the world's communicator; the units' reduce-scatters
//                    (averages), started as backward reported each unit (ShardSync, the pass's unit
//                    listener), are waited for; scope node averages each piece across the nodes;
//   squaredNorm      Σ g² of this rank's pieces (real elements), with gradScale not yet applied;
//   reducePartials   the shard group's (sum, ballot) rows gathered as raw bits and added in rank
//                    order: every rank gets the same norm and verdict;
//   update           each piece's gradient scaled by gradScale times the clip coefficient (one
//                    multiply, as the whole-gradient update does) and the optimizer, made over the
//                    map (nn::Optimizer::shardOver), stepping this rank's pieces in place;
//   endStep          after an applied step, every unit's parameters all-gathered from the pieces.
// Every rank holds the whole parameter buffer (stages 1 and 2). The averages are the replicas'
// arithmetic where the reduce-scatter adds in the all-reduce's order (shm, mpi: the same bits as
// stage 0 for the same gradients); the global norm's sum runs over the pieces instead of the
// whole buffer, so the clip coefficient can differ from stage 0's in the last bit.
// On a GPU (PlacementContext::gpu, either scope; fp32, or bf16 passes whose gathers send what they
// read as bf16 in bf16, ShardedOptions::precision) the communicator is nccl on the compute stream
// and every buffer ShardSync keeps is device memory (shard_sync.h says how the stream orders the
// collectives, the copies and the windows' reuse); the optimizer's state is on the GPU, stepped one
// kernel per piece (stages 1, 2) or over the packed shard (3); Σ g² is summed on the device and read
// once per step (the one host wait inside a step). It never defers a step (splitsGradient).
// Ownership: owns its communicators; borrows the parameters and the optimizer, whose state it
// replaces by the shard's. Thread safety: as Placement; every stage is collective.
#pragma once

#include <memory>
#include <optional>

#include "collectives/communicator.h"
#include "nn/shard_map.h"
#include "train/placement/placement.h"
#include "train/placement/placement_choice.h"
#include "train/placement/shard_sync.h"

namespace cohort::train {

struct ShardedOptions {
  int stage = 1;  // 1, 2 or 3
  ZeroScope scope = ZeroScope::kJob;
  bool prefetch = true;  // stage 3 (JobOptions::zeroPrefetch)
  runtime::DType precision = runtime::DType::kF32;  // the passes' (JobOptions::precision): bf16 gathers
  std::string backend;  // the world's communicator ("" : the world's default)
};

class ShardedPlacement final : public Placement {
 public:
  ShardedPlacement(const PlacementContext& context, const ShardedOptions& options);
  ~ShardedPlacement() override;

  std::unique_ptr<JobCollectives> makeCollectives() override;
  nn::UnitListener* unitListener() override { return sync_.get(); }
  // Stages 2 and 3 hear every micro-batch's pass (the gradient windows; stage 3's gathers).
  bool listensEveryMicroBatch() const override { return options_.stage >= 2; }
  void gatherAllParams() override { sync_->gatherAll(); }
  void releaseGatheredParams() override { sync_->releaseAll(); }
  void beginPass(int microBatch, int microBatches) override;
  uint64_t gradientReductions() const override { return sync_->reduceScatters(); }
  uint64_t gatheredBytes() const override { return sync_->gatheredBytes(); }
  std::optional<StateBytes> stateBytes() const override;
  std::optional<runtime::Tensor> gatherWholeParams() override;
  // --- checkpoints: defined in sharded_placement_checkpoint.cc ---
  SavedState saveState() override;
  void loadState(const CheckpointReader& reader) override;
  // --- end of checkpoints ---

  void reduceGradients(const StepPlan& plan, LossVote& vote) override;
  PartialNorm squaredNorm(const StepPlan& plan) override;
  bool splitsGradient() const override { return true; }
  void reducePartials(std::span<double, 2> sumAndBallot) override;
  int gradientRank() const override { return -1; }
  void update(const StepPlan& plan, float clip) override;
  void endStep(const StepResult& result) override;

  const collectives::Communicator& communicator() const { return *world_; }
  // The map of this rank's shard group (the job's ranks, or this node's with scope node).
  const nn::ShardMap& shardMap() const { return *map_; }
  // Whether this rank's shard is the one a checkpoint keeps: every rank with scope job; with scope
  // node, the ranks of the first node (every node holds the same shards).
  bool keepsShard() const { return !cross_ || cross_->rank() == 0; }
  // This rank's packed shard of the parameters (map.shardNumel() floats, zero padding), and back (CPU):
  // the piece of every unit set from a packed shard (then gathered by the caller's next step; call
  // gatherParams() to make the whole parameters current at once). Collective: gatherParams().
  // stageParams copies the real elements only (the padding of `shard` is left as it is) and, on a
  // GPU, only enqueues the copies on the compute stream: into pinned memory they are done when an
  // event recorded after them is (packParams waits for the stream).
  void packParams(float* shard) const;
  void stageParams(float* shard) const;
  // Where ShardSync keeps the shards: the CPU's memory or the GPU's, with its compute stream.
  const ShardMemory& memory() const { return sync_->memory(); }
  void unpackParams(const float* shard);
  void gatherParams();

 private:
  void placeWholeBuffers(collectives::Communicator& shard);
  // The whole flat buffer of a rank-packed `shard` (in ShardSync's memory) in a CPU tensor.
  runtime::Tensor gatherToHost(const float* shard);
  nn::ParamBuffer& params_;
  nn::Optimizer& optimizer_;
  std::chrono::milliseconds timeout_;
  Timeline& timeline_;
  ShardedOptions options_;
  std::unique_ptr<collectives::Communicator> world_;
  std::unique_ptr<collectives::Communicator> node_;   // scope node: this node's ranks
  std::unique_ptr<collectives::Communicator> cross_;  // scope node: this local rank on every node
  collectives::BufferPtr values_, grads_;
  std::optional<nn::ShardMap> map_;
  std::unique_ptr<ShardSync> sync_;
};

}  // namespace cohort::train
