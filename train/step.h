// What one optimizer step is asked to do and what it did (train::Job::step; docs/api.md): gradient
// clipping by global norm, the checks for a non-finite loss or gradient, the gradient's norm.
//
// Every step measures the global L2 norm of the gradient the optimizer is about to apply (averaged
// over the ranks in allreduce, this worker's own in local and Hogwild). A non-finite loss (any
// rank's, where ranks step together) or gradient is never applied: the parameters, the optimizer
// state and its step count stay as they were, and the result says which value was non-finite; the
// loop decides whether to stop or skip (the Trainer stops with train::Diverged unless told to skip).
//
// When results arrive. By default Job::step returns the step's result: on a GPU it waits for the
// gradient's norm. A deferred step (StepOptions::deferResult, GPU) waits for nothing: the check,
// the clip coefficient and the decision to apply or skip are made on the device
// (train/step/step_guard.h), and Job::step returns a result with `pending` set. Job::settleStep()
// returns the results in step order, waiting only for the one it returns; a loop calls it after
// queueing the next step, so the GPU runs step n while the host queues step n + 1, and drains the
// rest before it reads the parameters (checkpoints, evaluation, the end). A deferred non-finite step
// beyond StepOptions::skipNonFinite halts the device: no step after it is applied either, until
// every pending result has been taken.
//
// Spikes. A loss or gradient that stays finite but jumps (a corrupt batch, a learning rate far too
// high) can wreck a network as surely as a NaN. With StepOptions::skipSpikes = z, Job keeps the
// last kSpikeWindow applied steps' losses and gradient norms (train/spike_detector.h) and refuses a
// step whose value exceeds their mean by more than z standard deviations (at least z% of the mean,
// so a flat history does not make every wobble a spike), once kSpikeHistory steps were applied. A
// refused step is skipped like a non-finite one (nothing applied) and its values stay out of the
// history. Ranks that step together decide alike: the gradient's norm is the same on all of them,
// and a rank whose own loss spiked votes with the non-finite flags (the lowest such rank is named).
// The history starts afresh with each Job (a resumed run judges again after kSpikeHistory steps).
// On a GPU the loop passes no loss, so only the gradient's norm is judged, on the device.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "runtime/error.h"

namespace cohort::train {

class StepGraph;

struct StepOptions {
  // > 0: scale the gradient so that its global L2 norm is at most this (PyTorch's clip_grad_norm_:
  // by max / (norm + 1e-6) when that is below 1). 0: no clipping.
  float clipGradNorm = 0;
  // This rank's loss of the step (e.g. the mean over its micro-batches). A non-finite loss on any
  // rank makes the step non-finite on every rank that steps with it. Pass it on every rank or on
  // none (with it, ranks that step together exchange one flag per step). Unset: only the gradient
  // is checked.
  std::optional<double> loss = {};
  // The learning rate of the optimizer's step after `steps` applied ones (a schedule): set, the step
  // uses lrAt(optimizer.steps()) instead of the optimizer's lr, and leaves it set to that. A deferred
  // step needs it as a function: the host does not know yet whether the step before it applied.
  std::function<float(int64_t steps)> lrAt = {};
  // GPU: queue the step and return at once with a pending result (see "When results arrive"); on
  // the CPU the step runs as usual and its result is kept for settleStep().
  bool deferResult = false;
  // Deferred steps: how many more non-finite steps may be skipped, counted after the results already
  // taken; the next one halts the device's guard.
  int64_t skipNonFinite = 0;
  // > 0: the spike rule (see "Spikes" above) with this z: a step whose loss (this rank's, where
  // given) or gradient norm lies more than skipSpikes standard deviations above the mean of the
  // recent applied steps is not applied. 0: off.
  double skipSpikes = 0;
  // A deferred step's device work (Σ g², the judge, the optimizer's kernel) joins this CUDA graph
  // (train/step_graph.h: the Trainer's, which captures the step's forward and backward and calls
  // Job::step from StepGraph::run). Null: enqueued as it comes (a loop of one's own).
  StepGraph* graph = nullptr;
};

enum class NonFinite { kNone, kLoss, kGradient };
// A finite step the spike rule refused (StepOptions::skipSpikes): its loss, or its gradient's norm.
enum class Spike { kNone, kLoss, kGradient };

struct StepResult {
  // The gradient's global L2 norm before clipping (in allreduce the same on every rank); NaN or
  // inf when an element is.
  double gradNorm = 0;
  // False for a non-finite step: nothing was updated.
  bool applied = true;
  NonFinite nonFinite = NonFinite::kNone;
  // A finite step not applied because a value spiked (never with nonFinite).
  Spike spike = Spike::kNone;
  // kLoss (non-finite or spike): the lowest rank whose loss was. kGradient: this rank in local and
  // Hogwild (its own gradient), -1 in allreduce (the average over the ranks was).
  int rank = -1;
  // Spike::kGradient: the largest norm the rule would have applied (the mean + z standard deviations).
  double gradNormLimit = 0;
  // A deferred step whose outcome is not known yet (Job::settleStep returns it); the other fields
  // mean nothing.
  bool pending = false;
  // Deferred: the device's guard is halted, by this step (non-finite beyond skipNonFinite) or an
  // earlier one; nothing was applied.
  bool halted = false;
  // "the loss is nan on rank 1", "the gradient is non-finite (norm inf, averaged over the ranks)".
  std::string describe() const;
};

// A non-finite loss or gradient stopped training (the Trainer; exit code 6 from `cohort train`).
class Diverged : public Error {
 public:
  explicit Diverged(const std::string& what) : Error(what, ExitCode::kDiverged) {}
};

}  // namespace cohort::train
