// Placement: where a job's parameters, gradients and optimizer state live, and the stages of a
// training step that depend on it (internal to train/: users reach it through train::Job). The
// other half of the former Strategy interface is train/placement/job_collectives.h.
//
// A placement is made once by the factory (train/placement/placement_factory.h) from the job's resolved
// choice (train/placement/placement_choice.h). It borrows the model's ParamBuffer and the optimizer, whose
// memory it has placed (private, a shared segment, a GPU share), and owns the transports it set up
// (communicators, segments), which its JobCollectives borrows (makeCollectives()).
//
// The step. Every step runs the one pipeline (train/step/step_pipeline.h), which calls these stages in
// order; a placement supplies the stages, never the order:
//   1. beginStep         what must precede the reduction (the shared copy: the node's barrier
//                        "gradients"; GPU Hogwild: the owner of the shared copy is alive);
//   2. reduceGradients   completes the gradient's reduction over the ranks (replicas: the buckets'
//                        all-reduce; the shared copy: this rank's slice averaged over the node, and
//                        across nodes over the same local rank of every node) and, where the vote
//                        travels on a communicator, starts and finishes the loss vote around it
//                        (LossVote, the one vote) so that its latency hides in the reduction's;
//   3. squaredNorm       Σ g² of the gradient this rank holds (the whole buffer, or its slice);
//   4. reducePartials    only where the gradient is split (splitsGradient()): ONE reduction of the
//                        ranks' (partial sum, loss ballot) pairs, added in rank order, so every rank
//                        gets the same norm and verdict; whole-gradient placements skip it;
//   5. (the pipeline judges: judgeStep, and the clip coefficient from the norm)
//   6. update            the optimizer on what this rank updates (the whole buffer, or its slice),
//                        the gradient scaled by gradScale and the clip coefficient; only when the
//                        step is applied;
//   7. endStep           what must follow (the shared copy: the barrier "parameters" after an
//                        applied step; Hogwild across nodes: the averaging's turn), applied or not.
// A deferred GPU step (StepPlan::defer) replaces 3–6 by stepDeferred: the device judges and the
// optimizer's kernel applies (train/step/step_guard.h); only whole-gradient placements defer.
//
// Where the sharded stages go (ZeRO 1–3, issue 46): a ShardedPlacement over an nn::ShardMap is one
// more placement, no new pipeline: 2. reduce-scatter the gradient buckets as backward reports units
// (LossVote over the world communicator around it), 3. Σ g² of this rank's shard, 4. one scalar
// reduction of the partial sums (raw bits gathered, added in rank order), 6. the optimizer on the
// rank's shard (nn::Optimizer over the shard map), 7. all-gather the parameters (stage 3: per unit
// before its forward, in the unit listener, instead of here).
// Every wait is bounded by the job's timeout and throws TimeoutError or PeerError naming the rank.
// Thread safety: the training thread only. Every stage is collective where the placement's ranks
// step together (same order on every rank).
#pragma once

#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/module.h"
#include "nn/optimizer.h"
#include "nn/param_buffer.h"
#include "runtime/tensor.h"
#include "runtime/world_info.h"
#include "train/observe/timeline.h"
#include "train/placement/job_collectives.h"
#include "train/state_bytes.h"
#include "train/step.h"
#include "train/step/step_guard.h"
#include "train/test_hooks.h"

namespace cohort::runtime::cuda {
class GpuContext;
}

namespace cohort::train {

class LossVote;

// A checkpoint being loaded: its tensors and metadata, and the path for messages.
class CheckpointReader {
 public:
  CheckpointReader(const nn::Checkpoint& checkpoint, std::string path)
      : checkpoint_(checkpoint), path_(std::move(path)) {}
  // Copies the tensor `name` into `into` (any device); IoError when missing or of another size.
  void load(const std::string& name, const runtime::Tensor& into) const;
  // The metadata value `key` as a count; IoError when missing or not a non-negative integer.
  int64_t count(const std::string& key) const;
  const std::string& text(const std::string& key) const;
  const nn::Metadata& metadata() const { return checkpoint_.metadata; }
  const std::string& path() const { return path_; }

 private:
  const nn::Checkpoint& checkpoint_;
  std::string path_;
};

// What Job::step asks of a step.
struct StepPlan {
  float gradScale = 1;        // multiplies the gradient before the update (1/K for K micro-batches)
  float clipGradNorm = 0;     // StepOptions::clipGradNorm
  OwnLoss loss;               // this rank's loss: finite, a spike (train/step.h, "Spikes")
  bool exchangeLoss = false;  // ranks that step together agree on `loss` (the same on every rank)
  // The spike rule's largest gradient norm (train/step.h, "Spikes"); +inf: no rule.
  double maxGradNorm = std::numeric_limits<double>::infinity();
  StepGuard* guard = nullptr;  // the job's: measures the gradient, and judges a deferred step
  // GPU: judge and apply on the device and return a pending result (StepGuard::settle has it);
  // the learning rates are those of Optimizer::DeferredStep.
  bool defer = false;
  int64_t skipsLeft = 0;  // StepOptions::skipNonFinite
  float lrIfSettled = 0, lrIfOneMore = 0;
  StepGraph* graph = nullptr;  // a deferred step's device work joins it (StepOptions::graph)
};

// What a placement adds to a checkpoint: the optimizer state tensors and step counts.
struct SavedState {
  std::vector<nn::NamedTensor> tensors;
  nn::Metadata metadata;
};

// Σ g² of what this rank holds; the gradient's norm is scale · sqrt(Σ over the ranks' sums), scale
// being the gradScale a whole-gradient placement has not applied yet (1 where the reduction did).
struct PartialNorm {
  double squares = 0;
  float scale = 1;
};

class Placement {
 public:
  virtual ~Placement() = default;

  // The job's collectives over this placement's transports; borrows them (destroy it first).
  virtual std::unique_ptr<JobCollectives> makeCollectives() = 0;
  // Goes into the pass that synchronises (nn::Pass::units); nullptr: nothing to overlap.
  virtual nn::UnitListener* unitListener() { return nullptr; }
  // Whether every micro-batch's pass carries unitListener() (not only the last's, which
  // synchronises); beginPass is told before each training pass (micro-batch k of K).
  virtual bool listensEveryMicroBatch() const { return false; }
  // Where the parameters are sharded (ZeRO 3): collective, every unit's parameters gathered until
  // releaseGatheredParams (Job::ParamsGathered); nothing elsewhere.
  virtual void gatherAllParams() {}
  virtual void releaseGatheredParams() {}
  virtual void beginPass(int microBatch, int microBatches) {
    (void)microBatch;
    (void)microBatches;
  }
  // Whether the parameters are one copy that several ranks share (only one rank may load them,
  // and nobody may update them while rank 0 writes a checkpoint).
  virtual bool sharedParams() const { return false; }
  // Whether the values on this rank's GPU change only by its own optimizer's step (update and
  // stepDeferred), which then keeps a trusted bf16 copy current (Job::trustHalfCopy).
  virtual bool keepsHalfCopy() const { return false; }
  // How many times this rank has reduced gradients across ranks (bucket all-reduces, or slice
  // reductions); 0 where gradients are never reduced (local, Hogwild).
  virtual uint64_t gradientReductions() const { return 0; }
  // The bytes this rank's all-gathers of parameters have received (ZeRO); 0 where there are none.
  virtual uint64_t gatheredBytes() const { return 0; }
  // Collective where the parameters are sharded (ZeRO 3): the whole parameters gathered into a fresh
  // CPU tensor; nullopt: they are whole in the ParamBuffer already (Job::wholeParams copies them).
  virtual std::optional<runtime::Tensor> gatherWholeParams() { return std::nullopt; }
  // What this rank holds of the model's state, from the placement's own buffers; nullopt: the
  // whole model's buffers and optimizer state (Job::stateBytes counts them).
  virtual std::optional<StateBytes> stateBytes() const { return std::nullopt; }
  // Collective; the result is complete on rank 0, the rank that writes.
  virtual SavedState saveState() = 0;
  // Collective: loads what this rank holds of the checkpoint's parameters and optimizer state.
  virtual void loadState(const CheckpointReader& reader) = 0;

  // The step's stages (see the header comment), in the pipeline's order.
  virtual void beginStep(const StepPlan& plan) { (void)plan; }
  virtual void reduceGradients(const StepPlan& plan, LossVote& vote) = 0;
  virtual PartialNorm squaredNorm(const StepPlan& plan) = 0;
  virtual bool splitsGradient() const { return false; }
  // Split placements: `sumAndBallot` = {this rank's Σ g², its loss ballot} becomes {the sum over
  // the ranks in rank order, the largest ballot}.
  virtual void reducePartials(std::span<double, 2> sumAndBallot) { (void)sumAndBallot; }
  // StepResult::rank of a non-finite or spiking gradient: this rank where it steps its own
  // gradient, -1 where the gradient is the ranks' average.
  virtual int gradientRank() const = 0;
  virtual void update(const StepPlan& plan, float clip) = 0;
  virtual StepResult stepDeferred(const StepPlan& plan, LossVerdict loss);
  virtual void endStep(const StepResult& result) { (void)result; }
};

// What every placement is made from. The parameters arrive bound on the CPU; `initialise` fills them
// there (a seeded reset, or the user's own); the placement decides which ranks run it and moves the
// parameters where it keeps them (a GPU, shared memory, a GPU share).
struct PlacementContext {
  nn::ParamBuffer& params;
  nn::Optimizer& optimizer;
  const runtime::WorldInfo& world;
  std::chrono::milliseconds timeout;
  runtime::cuda::GpuContext* gpu = nullptr;  // train on this GPU; nullptr: the CPU
  std::function<void()> initialise;
  // The job's timeline (train/observe/timeline.h): placements record their barriers, all-reduces and updates.
  Timeline& timeline;
  // The job's test hooks (JobOptions::testHooks): its mpi communicators' fault injection, the
  // averaging's log.
  TestHooks testHooks = {};
};

// The fault injection TestHooks::mpiMismatch asks of every communicator a placement makes.
collectives::CommunicatorOptions::FaultInjection faultInjectionOf(const TestHooks& hooks);

// The stages of a rank that holds the whole gradient it applies (local, Hogwild, replicas once
// averaged): its norm is plan.gradScale times the buffer's (plan.guard measures it); the update
// scales the gradient once (gradScale times the clip coefficient) and steps the optimizer;
// deferred, the device judges and the optimizer's kernel applies the scale (the gradient buffer is
// left unscaled).
struct WholeGradient {
  nn::ParamBuffer& params;
  nn::Optimizer& optimizer;
  runtime::cuda::GpuContext* gpu = nullptr;

  PartialNorm squaredNorm(const StepPlan& plan) const;
  // A trusted bf16 copy of the values (nn/param_buffer.h) is the optimizer's to write: both check it
  // is (Job::trustHalfCopy wires it), and the step's kernel keeps it current.
  void update(const StepPlan& plan, float clip) const;
  StepResult stepDeferred(const StepPlan& plan, LossVerdict loss, int gradientRank) const;
  void requireHalfCopyWriter() const;
};

// A placement that is its ranks' whole gradient (local, replicas): the WholeGradient stages.
class WholeGradientPlacement : public Placement {
 public:
  PartialNorm squaredNorm(const StepPlan& plan) override { return whole_.squaredNorm(plan); }
  void update(const StepPlan& plan, float clip) override { whole_.update(plan, clip); }
  StepResult stepDeferred(const StepPlan& plan, LossVerdict loss) override {
    return whole_.stepDeferred(plan, loss, gradientRank());
  }
  bool keepsHalfCopy() const override { return whole_.gpu != nullptr; }

 protected:
  explicit WholeGradientPlacement(const WholeGradient& whole) : whole_(whole) {}
  WholeGradient whole_;
};

// Moves CPU-bound parameters to `gpu`'s device (gradients and buffers in its caching allocator);
// nothing when gpu is nullptr.
void moveToGpu(nn::ParamBuffer& params, runtime::cuda::GpuContext* gpu);
// The GPU's compute stream (CommunicatorOptions::computeStream for nccl); nullptr for the CPU.
const runtime::Stream* computeStreamOf(runtime::cuda::GpuContext* gpu);
// Multiplies the gradients by `scale` (nothing when it is 1): on the CPU, or on `gpu`'s stream.
void scaleGradients(const nn::ParamBuffer& params, float scale, runtime::cuda::GpuContext* gpu);
// The optimizer state of a job with one state (local, replicas, the shared copy): "optimizer.<state>"
// and the step count "optimizer_steps".
SavedState singleOptimizerState(const nn::Optimizer& optimizer);
void loadSingleOptimizerState(const CheckpointReader& reader, nn::Optimizer& optimizer);
// Every parameter by name.
void loadParams(const CheckpointReader& reader, const nn::ParamBuffer& params);

}  // namespace cohort::train
