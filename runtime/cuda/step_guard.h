// The device side of a step that never waits for the host (train/step/step_guard.h): one tiny kernel
// that judges a step from its gradient's sum of squares, and the values the optimizer kernels read
// to apply it or not.
//
// The step's decision lives in device memory (StepGuardState). Per step, on the compute stream and
// without a host wait:
//   storeOnDevice of the step's JudgeOptions and of the optimizer's OptimizerStepArgs (what changes
//   every step; never inside a CUDA graph) -> sumOfSquares (elementwise.h) -> judgeStep (here, one
//   thread, reading its options through a pointer) -> the optimizer's multi-tensor kernel, which
//   reads StepControl: `apply`, the gradient multiplier and how many steps were applied before it
//   -> an asynchronous copy of the StepRecord to pinned host memory, read a step later.
// Everything between the two copies reads fixed addresses only, so a CUDA graph may capture it
// (train/step_graph.h).
// judgeStep computes what train::judgeStep and nn::clipCoefficient compute on the host, with the
// same roundings (double norm, float coefficient), so the guarded update is bit for bit the one the
// host would have ordered. A non-finite step counts against `nonFiniteLimit`; the first one beyond
// it latches `halted`, and a halted guard applies nothing until the host seeds it again (which it
// does only once it has read every record, so it has seen the halt).
// Thread safety: as the stream's ordering; one guard state per stream.
// Only built when CUDA is compiled in (COHORT_HAVE_CUDA).
#pragma once

#include <cstdint>
#include <limits>

#include "runtime/stream.h"

namespace cohort::runtime::cuda {

// What the optimizer kernels read (device memory, written by judgeStep).
struct StepControl {
  int apply = 0;               // 1: update; 0: a non-finite step, or the guard is halted
  float gradMultiplier = 1;    // gradScale x the clip coefficient, applied to every gradient element
  long long appliedBefore = 0;  // optimizer steps applied before this one (Adam's t - 1; SGD's first step)
};

// What the host learns of one step.
struct StepRecord {
  double gradNorm = 0;          // gradScale x sqrt(sum of squares): before clipping
  long long appliedSteps = 0;   // after this step
  long long nonFiniteSteps = 0;  // since the last seed, this step included
  int applied = 0;
  int nonFinite = 0;  // 0 none, 1 the loss (lossRank), 2 the gradient
  int halted = 0;     // the guard is halted (this step or an earlier one used up the skips)
  int spike = 0;      // a finite step refused by the spike rule: 1 the loss, 2 the gradient's norm
};

// The guard's device memory: one per stream that steps.
struct StepGuardState {
  StepControl control;
  long long applied = 0;
  long long nonFinite = 0;
  int halted = 0;
  int pad = 0;
};

struct JudgeOptions {
  float gradScale = 1;     // the norm is gradScale x sqrt(sum); the gradient is multiplied by it
  float clipGradNorm = 0;  // > 0: clip to this norm (nn::clipCoefficient)
  int lossNonFinite = 0;   // 1: the host already knows the loss is non-finite
  int lossSpike = 0;       // 1: the host already knows the loss spiked (train/step.h, "Spikes")
  // A finite norm above this is a spike: the step is not applied, and counts against nothing.
  double maxGradNorm = std::numeric_limits<double>::infinity();
  // The guard halts at the first non-finite step that makes nonFinite exceed this.
  long long nonFiniteLimit = 0;
  // 1: first reset the state to `seedApplied` applied steps, no non-finite step, not halted (the
  // host does so when it has read every record, so its counts are the truth).
  int seed = 0;
  long long seedApplied = 0;
};

// Judges one step from `sumOfSquares` (device, one double: elementwise.h's scratch[0]) into
// state->control and *record (both device memory), with the options *options (device memory,
// written by storeOnDevice before: the kernel's arguments never change, so a CUDA graph may
// capture it). One thread; enqueued on `stream`.
void judgeStep(const double* sumOfSquares, const JudgeOptions* options, StepGuardState* state, StepRecord* record,
               const Stream& stream);

// *device = value (device memory), by one tiny kernel that takes the value as its argument: how the
// values that change every step (the judge's options, the optimizer's learning rates) reach the
// kernels that read them through a pointer, outside any CUDA graph (train/step_graph.h). Defined for
// JudgeOptions and OptimizerStepArgs of SgdStepOptions and AdamStepOptions.
template <class T>
void storeOnDevice(T* device, const T& value, const Stream& stream);

// The optimizer's multi-tensor apply: the whole flat buffer cut into chunks of at most
// kOptimizerChunkElements elements, each inside one parameter group's run, built once per optimizer
// in device memory; one kernel steps every chunk (block b the chunks b, b + grid, ...), each with its
// rate's options (a rate: one distinct (weight decay, lr scale) of the runs).
constexpr int kOptimizerChunkElements = 1 << 16;
constexpr int kOptimizerRatesPerBlock = 16;
struct OptimizerChunk {
  long long begin = 0;  // flat index of its first element
  int count = 0;
  int rate = 0;  // index into OptimizerStepArgs's options
};
// A step's options per rate, in device memory (storeOnDevice): `ifSettled` unless a StepControl says
// that a step still unknown to the host applied (control->appliedBefore != settledSteps: at most
// one, as the host reads a step's record only after queueing the next), then `ifOneMore`. One
// block holds kOptimizerRatesPerBlock rates (a kernel argument's size bounds what one store
// carries); an optimizer with more rates has consecutive blocks, rate r in block r / 16 (every
// block's settledSteps the same), each stored by its own storeOnDevice.
template <class Options>
struct OptimizerStepArgs {
  long long settledSteps = 0;
  Options ifSettled[kOptimizerRatesPerBlock] = {};
  Options ifOneMore[kOptimizerRatesPerBlock] = {};
};

}  // namespace cohort::runtime::cuda
