// What one optimizer step is asked to do and what it did (train::Job::step; docs/api.md): gradient
// clipping by global norm, the checks for a non-finite loss or gradient, the gradient's norm.
//
// Every step measures the global L2 norm of the gradient the optimizer is about to apply (averaged
// over the ranks in allreduce, this worker's own in local and Hogwild). A non-finite loss (any
// rank's, where ranks step together) or gradient is never applied: the parameters, the optimizer
// state and its step count stay as they were, and the result says which value was non-finite; the
// loop decides whether to stop or skip (the Trainer stops with train::Diverged unless told to skip).
#pragma once

#include <optional>
#include <string>

#include "runtime/error.h"

namespace cohort::train {

struct StepOptions {
  // > 0: scale the gradient so that its global L2 norm is at most this (PyTorch's clip_grad_norm_:
  // by max / (norm + 1e-6) when that is below 1). 0: no clipping.
  float clipGradNorm = 0;
  // This rank's loss of the step (e.g. the mean over its micro-batches). A non-finite loss on any
  // rank makes the step non-finite on every rank that steps with it. Pass it on every rank or on
  // none (with it, ranks that step together exchange one flag per step). Unset: only the gradient
  // is checked.
  std::optional<double> loss;
};

enum class NonFinite { kNone, kLoss, kGradient };

struct StepResult {
  // The gradient's global L2 norm before clipping (in allreduce the same on every rank); NaN or
  // inf when an element is.
  double gradNorm = 0;
  // False for a non-finite step: nothing was updated.
  bool applied = true;
  NonFinite nonFinite = NonFinite::kNone;
  // kLoss: the lowest rank whose loss was non-finite. kGradient: this rank in local and Hogwild
  // (its own gradient), -1 in allreduce (the average over the ranks was).
  int rank = -1;
  // "the loss is nan on rank 1", "the gradient is non-finite (norm inf, averaged over the ranks)".
  std::string describe() const;
};

// A non-finite loss or gradient stopped training (the Trainer; exit code 6 from `cohort train`).
class Diverged : public Error {
 public:
  explicit Diverged(const std::string& what) : Error(what, ExitCode::kDiverged) {}
};

}  // namespace cohort::train
