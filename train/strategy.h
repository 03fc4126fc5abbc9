// Strategy: how the ranks of a job train one model together — what a training loop needs from them
// and nothing else (internal to train/: users reach it through train::Job).
//
// A strategy is made by Job::place() for the job's mode (train/job.cc; docs/architecture.md,
// "Choosing the strategy") and borrows the model's ParamBuffer and the optimizer, whose memory it
// has placed (private, a shared segment, a GPU share). The loop calls, per optimizer step: the
// listener unitListener() returns goes into the pass (forward and backward) that must synchronise
// (nn::Pass::units; nullptr: nothing to overlap); then step(plan), which
// synchronises the gradients where the mode does, measures the gradient's global norm, and applies
// the optimizer (clipped) unless the loss or the gradient is non-finite (train/step.h). Around it:
//   barrier(what)   every rank, same names, same order;
//   reduce(v, op)   a small collective over scalars (the job's loss, throughput, stop votes);
//   lockstep()      whether ranks step together: Hogwild workers do not, so a collective between
//                   epoch ends would stall them;
//   saveState()/loadState()  the optimizer state (and the parameters where a rank must load them)
//                   as checkpoints hold it: collective; what a rank saves or loads depends on where
//                   the state lives (private, shared by the node, one per rank).
// Every wait is bounded by the job's timeout and throws TimeoutError or PeerError naming the rank.
// Thread safety: the training thread only.
#pragma once

#include <chrono>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "nn/checkpoint.h"
#include "nn/module.h"
#include "nn/optimizer.h"
#include "nn/param_buffer.h"
#include "runtime/tensor.h"
#include "runtime/world_info.h"
#include "train/step.h"
#include "train/step_guard.h"
#include "train/timeline.h"

namespace cohort::train {

enum class ScalarOp { kSum, kMean, kMax };

// A checkpoint being loaded: its tensors and metadata, and the path for messages.
class CheckpointReader {
 public:
  CheckpointReader(const nn::Checkpoint& checkpoint, std::string path) : checkpoint_(checkpoint), path_(std::move(path)) {}
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

// What Job::step asks of a strategy.
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
};

// What a strategy adds to a checkpoint: the optimizer state tensors and step counts.
struct SavedState {
  std::vector<nn::NamedTensor> tensors;
  nn::Metadata metadata;
};

class Strategy {
 public:
  virtual ~Strategy() = default;

  virtual nn::UnitListener* unitListener() { return nullptr; }
  // Every rank that steps together decides alike: applied, or not and why (train/step.h).
  virtual StepResult step(const StepPlan& plan) = 0;
  virtual void barrier(const std::string& what) = 0;
  virtual void reduce(std::span<double> values, ScalarOp op) = 0;
  virtual bool lockstep() const { return true; }
  // Whether the parameters are one copy that several ranks share (only one rank may load them,
  // and nobody may update them while rank 0 writes a checkpoint).
  virtual bool sharedParams() const { return false; }
  // Collective; the result is complete on rank 0, the rank that writes.
  virtual SavedState saveState() = 0;
  // Collective: loads what this rank holds of the checkpoint's parameters and optimizer state.
  virtual void loadState(const CheckpointReader& reader) = 0;
  // Throws PeerError when a rank this one depends on has gone (GPU Hogwild: the owner of the
  // shared parameters), looking for up to `settle` (see ipc::DeviceShare::throwIfOwnerLost).
  virtual void checkPeers(std::chrono::milliseconds settle) {}
  // How many times this rank has reduced gradients across ranks (bucket all-reduces, or sharded
  // reductions); 0 where gradients are never reduced (local, Hogwild).
  virtual uint64_t gradientReductions() const { return 0; }
  // This rank is failing with `error` (called before it unwinds out of step(), barrier() or
  // reduce()): ranks of its node that wait for it in shared memory fail at once with its reason
  // rather than time out on it (SegmentStrategy: ipc::ProcessBarrier::abandon).
  virtual void abandon(const Error& error) {}
};

}  // namespace cohort::train

namespace cohort::runtime::cuda {
class GpuContext;
}

namespace cohort::train {

// What every strategy is made from. The parameters arrive bound on the CPU; `initialise` fills them
// there (a seeded reset, or the user's own); the strategy decides which ranks run it and moves the
// parameters where its mode keeps them (a GPU, shared memory, a GPU share).
struct StrategyContext {
  nn::ParamBuffer& params;
  nn::Optimizer& optimizer;
  const runtime::WorldInfo& world;
  std::chrono::milliseconds timeout;
  runtime::cuda::GpuContext* gpu = nullptr;  // train on this GPU; nullptr: the CPU
  std::function<void()> initialise;
  // The job's timeline (train/timeline.h): strategies record their barriers, all-reduces and updates.
  Timeline& timeline;
};

// Moves CPU-bound parameters to `gpu`'s device (gradients and buffers in its caching allocator);
// nothing when gpu is nullptr.
void moveToGpu(nn::ParamBuffer& params, runtime::cuda::GpuContext* gpu);

// Pieces the strategies share.
// Multiplies the gradients by `scale` (nothing when it is 1): on the CPU, or on `gpu`'s stream.
void scaleGradients(const nn::ParamBuffer& params, float scale, runtime::cuda::GpuContext* gpu);

// The step's verdict from the gradient's norm and the ranks' losses: a non-finite loss first, then a
// non-finite gradient (named by `gradientRank`, -1 for an average), then a loss spike, then a
// gradient norm above maxGradNorm (a spike).
StepResult judgeStep(double gradNorm, LossVerdict loss, int gradientRank, double maxGradNorm);

// A step where this rank holds the whole gradient the optimizer applies (local, Hogwild, and
// replicas once averaged): its norm is plan.gradScale times the buffer's (plan.guard measures it);
// unless judged non-finite or a spike, the gradient is scaled once (gradScale times the clip coefficient) and
// the optimizer steps (a kOptimizer span of `timeline`). Deferred (plan.defer), the device judges
// and the optimizer's kernel applies the scale; the gradient buffer is left unscaled.
StepResult stepWholeGradient(const StepPlan& plan, LossVerdict loss, int gradientRank, nn::ParamBuffer& params,
                             nn::Optimizer& optimizer, runtime::cuda::GpuContext* gpu, Timeline& timeline);
// The optimizer state of a job with one state (local, replicas, sharded): "optimizer.<state>" and
// the step count "optimizer_steps".
SavedState singleOptimizerState(const nn::Optimizer& optimizer);
void loadSingleOptimizerState(const CheckpointReader& reader, nn::Optimizer& optimizer);
// Every parameter by name.
void loadParams(const CheckpointReader& reader, const nn::ParamBuffer& params);
// `values` reduced elementwise with `op` over `ranks` rank-major rows of all (values.size() each).
void reduceRows(std::span<double> values, std::span<const double> all, int ranks, ScalarOp op);
// Every rank's `mine` (the same size on every rank), rank-major, gathered over `comm` as raw bits:
// each rank reduces exactly the values the others had (doubles do not survive a float reduction).
std::vector<double> gatherDoubles(collectives::Communicator& comm, std::span<const double> mine,
                                  std::chrono::milliseconds timeout);

}  // namespace cohort::train
