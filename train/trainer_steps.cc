// The Trainer's handling of a step's result (train/trainer.h): at once on the CPU and where steps are
// synchronous, a step later on a GPU (the result is deferred: train/step.h, "When results arrive").
#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

#include "runtime/error.h"
#include "train/observe/metrics_sink.h"
#include "train/observe/progress.h"
#include "train/trainer.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#endif

namespace cohort::train {

using runtime::Tensor;

bool Trainer::stopVoteDue(int64_t step) const {
  // Agreeing costs a small collective: every 16 steps (the same steps on every rank) is plenty for a
  // signal sent minutes before a time limit. Hogwild workers of one node meet for it too (a barrier
  // of their job segment every 16 steps, each worker's 16th step), so that a SIGTERM checkpoints
  // mid-epoch within cohortrun's grace period, as the workers promise; across nodes, where every
  // meeting is a full average of the nodes' copies, they agree at epoch ends.
  constexpr int64_t kAgreeEvery = 16;
  const runtime::WorldInfo& world = job_.world();
  const bool meet = job_.lockstep() || world.localWorldSize == world.worldSize;
  return !world.isSingle() && meet && step % kAgreeEvery == 0;
}

void Trainer::settleSteps(Position& pos, StepWindow& window, size_t keep) {
  while (queued_.size() > keep) {
    const std::optional<StepResult> result = job_.settleStep();
    COHORT_CHECK(result) << queued_.size() << " steps queued and none pending in the job";
    const QueuedStep queued = queued_.front();
    queued_.pop_front();
    afterStep(pos, window, queued, *result);
  }
}

void Trainer::afterStep(Position& pos, StepWindow& window, const QueuedStep& queued, const StepResult& result) {
  if (result.applied) {
    if (!job_.gpu()) pos.lossSum += queued.groupLoss;
    pos.correct += queued.correct;
    pos.samples += queued.samples;
    pos.gradNormSum += result.gradNorm;
    pos.gradNormMax = std::max(pos.gradNormMax, result.gradNorm);
    ++pos.gradNormSteps;
    window.samples += queued.samples;
    window.lossSum += queued.groupLoss;
    window.gradNormSum += result.gradNorm;
    ++window.steps;
    pos.spikesInARow = 0;
  } else if (result.spike != Spike::kNone) {
    spikeStep(pos, queued, result);
  } else {
    nonFiniteStep(pos, queued, result);
  }
  if (callbacks_.onStepEnd &&
      callbacks_.onStepEnd({.epoch = queued.epoch, .batch = queued.batch, .step = queued.step, .samples = queued.samples,
                            .loss = queued.loss, .gradNorm = result.gradNorm, .applied = result.applied}) == Next::kStop) {
    userStop_ = true;
  }
  logSteps(queued, window);
  const int64_t k = options_.accumulateSteps;
  if (progress_) progress_->step((queued.nextBatch + k - 1) / k, queued.samples, queued.loss);
}

void Trainer::nonFiniteStep(Position& pos, const QueuedStep& queued, const StepResult& step) {
  // A deferred step after the one that halted the device's guard: that one threw already.
  COHORT_CHECK(step.nonFinite != NonFinite::kNone) << "step " << queued.step << " was not applied but is finite";
  // A GPU cannot refuse bad input where the CPU's forward does (an Embedding's ids): it makes the
  // step non-finite, and this names the input instead (InvalidArgument, exit 2).
  if (job_.gpu()) checkStepInputs(queued);
  std::ostringstream what;
  what << describeStep(queued, step);
  if (step.nonFinite == NonFinite::kLoss && step.rank == job_.world().rank) {
    what << " (" << (std::isnan(queued.loss) ? "nan" : queued.loss > 0 ? "inf" : "-inf") << ")";
  }
  if (pos.skipped < options_.skipNonFinite) {
    ++pos.skipped;
    ++pos.skippedInEpoch;
    warnSkipped(what.str() + ": skipped, nothing applied (" + std::to_string(pos.skipped) + " of the " +
                std::to_string(options_.skipNonFinite) + " skips allowed)");
    return;
  }
  what << ": training diverged; nothing of this step was applied" << lastCheckpointNote();
  if (options_.skipNonFinite > 0) {
    what << " (the " << options_.skipNonFinite << " skips allowed are used up)";
  } else {
    what << " (lower the learning rate, clip the gradient, or skip such steps: --skip-nonfinite N)";
  }
  throw Diverged(what.str());
}

void Trainer::spikeStep(Position& pos, const QueuedStep& queued, const StepResult& step) {
  std::ostringstream what;
  what << describeStep(queued, step);
  if (step.spike == Spike::kLoss && step.rank == job_.world().rank) what << " (" << queued.loss << ")";
  if (pos.spikesInARow < options_.maxSpikesInARow) {
    ++pos.spikes;
    ++pos.spikesInEpoch;
    ++pos.spikesInARow;
    warnSkipped(what.str() + ": skipped, nothing applied (" + std::to_string(pos.spikesInARow) + " in a row of the " +
                std::to_string(options_.maxSpikesInARow) + " allowed; " + std::to_string(pos.spikes) + " in the run)");
    return;
  }
  what << ": training diverged: " << pos.spikesInARow + 1 << " spikes in a row (at most "
       << options_.maxSpikesInARow << " may be skipped in a row); nothing of this step was applied"
       << lastCheckpointNote() << " (lower the learning rate or clip the gradient)";
  throw Diverged(what.str());
}

std::string Trainer::describeStep(const QueuedStep& queued, const StepResult& step) const {
  return "step " + std::to_string(queued.step) + " (epoch " + std::to_string(queued.epoch + 1) + ", batch " +
         std::to_string(queued.nextBatch) + "): " + step.describe();
}

std::string Trainer::lastCheckpointNote() const {
  if (checkpointHeld_) return " and " + options_.checkpointPath + " holds the last checkpoint before it";
  if (!options_.checkpointPath.empty()) {
    return "; nothing was checkpointed before it (" + options_.checkpointPath + " was not written)";
  }
  return "";
}

void Trainer::warnSkipped(const std::string& what) {
  if (job_.lockstep() && job_.world().rank != 0) return;
  if (progress_) progress_->clearLine();
  job_.log().warn() << what;
}

// The step's batches are gathered from the dataset again: their device buffers were reused by the
// steps queued since (a deferred step is judged a step later). Evaluation mode trains nothing.
void Trainer::checkStepInputs(const QueuedStep& queued) {
#ifdef COHORT_HAVE_CUDA
  runtime::cuda::GpuContext& gpu = *job_.gpu();
  const nn::Pass pass = job_.evalPass();
  const runtime::data::Dataset& data = loader_.dataset();
  const auto rowFloats = static_cast<size_t>(data.sampleShape().numel());
  std::vector<float> target(static_cast<size_t>(data.targetShape().numel()));
  std::vector<int64_t> samples;
  for (int64_t b = queued.firstBatch; b <= queued.batch; ++b) {
    loader_.batchSamples(b, samples);
    runtime::Shape shape{static_cast<int64_t>(samples.size())};
    for (int i = 0; i < data.sampleShape().rank(); ++i) shape.push(data.sampleShape()[i]);
    Tensor host = Tensor::empty(shape, runtime::cpuAllocator());
    for (size_t i = 0; i < samples.size(); ++i) data.read(samples[i], host.data() + i * rowFloats, target.data());
    Tensor inputs = Tensor::empty(shape, gpu.allocator());
    runtime::cuda::copyToDevice(inputs.data(), host.data(), host.bytes(), gpu.stream());
    model_.forward(inputs, pass);
    // Freed device buffers are reused in stream order; `host` was staged by the copy.
    model_.net->checkInputs(pass);
  }
#else
  (void)queued;
#endif
}

StepFigures Trainer::stepFigures(const QueuedStep& queued, const StepWindow& window) const {
  const double seconds = secondsSince(window.start);
  StepFigures f;
  f.epoch = queued.epoch + 1;
  f.step = queued.step;
  f.lr = job_.optimizer().options().lr;
  f.samplesPerSec = seconds > 0 ? static_cast<double>(window.samples) / seconds : 0.0;
  if (window.steps > 0) f.gradNorm = window.gradNormSum / static_cast<double>(window.steps);
  // On a GPU the losses stay on the device until the epoch's end.
  if (!job_.gpu() && window.samples > 0) f.trainLoss = window.lossSum / static_cast<double>(window.samples);
  f.msPerStep = window.allSteps > 0 ? 1e3 * seconds / static_cast<double>(window.allSteps) : 0.0;
  if (loss_.positions() > 1) f.tokensPerSec = f.samplesPerSec * static_cast<double>(loss_.positions());
  // This rank's FLOPs against one device's peak (each rank has its own device, or its share of the CPU).
  if (flopsPerSample_ > 0 && peakFlops_ > 0) f.mfu = f.samplesPerSec * flopsPerSample_ / peakFlops_;
  return f;
}

void Trainer::logSteps(const QueuedStep& queued, StepWindow& window) {
  ++window.allSteps;
  if (options_.logEverySteps <= 0 || queued.step % options_.logEverySteps != 0) return;
  if (job_.world().rank == 0) {
    const StepFigures f = stepFigures(queued, window);
    logStepLine(f);
    if (metrics_) {
      metrics_->steps(f);
      if (!metrics_->failure().empty()) userStop_ = true;  // stop at the next checkpoint (Trainer::run throws)
    }
  }
  window = StepWindow{};
}

}  // namespace cohort::train
