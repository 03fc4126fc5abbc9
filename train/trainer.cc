// The Trainer's loop (train/trainer.h): run(), the end of each epoch, and evaluation.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <signal.h>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include "runtime/error.h"
#include "train/checkpoint/checkpointer.h"
#include "train/observe/metrics_sink.h"
#include "train/observe/progress.h"
#include "train/observe/trace_file.h"
#include "train/step_graph.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#include "runtime/data/device_loader.h"
#endif

namespace cohort::train {

using runtime::Tensor;

const char* toString(StopReason reason) {
  switch (reason) {
    case StopReason::kNone:
      return "none";
    case StopReason::kMaxSteps:
      return "max_steps";
    case StopReason::kRequest:
      return "signal";
    case StopReason::kCallback:
      return "callback";
  }
  return "?";
}

double Trainer::secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

Trainer::~Trainer() = default;

std::string Trainer::stopCause() const {
  if (metrics_ && !metrics_->failure().empty()) return "the metrics file cannot be written";
  if (userStop_) return "by a callback";
  if (!options_.stopRequested || !options_.stopRequested->load(std::memory_order_relaxed)) return "on another rank";
  const int signal = options_.stopSignal ? options_.stopSignal->load(std::memory_order_relaxed) : 0;
  if (signal == 0) return "a stop request";
  const char* name = ::sigabbrev_np(signal);
  return name ? std::string("SIG") + name : "signal " + std::to_string(signal);
}

// The batches of a run: from the host loader, or on a GPU through the device loader that copies
// them ahead.
struct Trainer::Batches {
  std::function<void(int64_t, int64_t)> startEpoch;
  std::function<bool(runtime::data::Batch&)> next;
#ifdef COHORT_HAVE_CUDA
  std::unique_ptr<runtime::data::DeviceLoader> device;
#endif
};

TrainResult Trainer::run() {
  const auto start = Clock::now();
  Position pos;
  if (options_.resume && loadCheckpoint(pos)) {
    note() << "resumed from " << options_.checkpointPath << " at epoch " << pos.epoch + 1 << " batch " << pos.batch
           << " (step " << pos.step << ")";
  }
  if (nothingToTrain(pos)) return alreadyDone(pos, start);  // the checkpoint left as it is
  // Only the placement's step writes the values from here on: the bf16 copy is trusted for the run
  // (Job::trustHalfCopy) and no longer once it ends, thrown or not.
  struct HalfCopyTrust {
    Job& job;
    ~HalfCopyTrust() { job.trustHalfCopy(false); }
  } trust{job_};
  if (!job_.options().testHooks.untrustedHalfCopy) job_.trustHalfCopy(true);
  if (options_.logStartLine) logStart();
  Batches batches = openBatches();
  stepGraph_ = makeStepGraph();
  job_.barrier("start");
  startObserving();
  // The schedule is a pure function of the optimizer's step count, which checkpoints hold: a resumed
  // run continues it exactly.
  if (schedule_) lrAt_ = [this](int64_t steps) { return schedule_->lrAt(steps); };
  // nanoGPT evaluates before the first step too; a resumed run did at its checkpoint's step.
  if (options_.evalEverySteps > 0 && pos.step == 0) evaluateAtStep(pos);
  TrainResult result;
  for (; pos.epoch < options_.epochs; ++pos.epoch, pos.batch = pos.seen = 0) {
    if (runEpoch(pos, batches, result)) break;
  }
  progress_.reset();  // erases a line still showing
  if (stepGraph_) {
    result.cudaGraphSteps = stepGraph_->graphSteps();
    result.cudaGraphNodes = stepGraph_->capturedNodes();
    result.cudaGraphsOff = stepGraph_->fallbackReason();
    stepGraph_.reset();  // its pool back to the allocator
  }
  finishRun(result, start);
#ifdef COHORT_HAVE_CUDA
  if (batches.device) result.inputWaitMs = batches.device->inputWaitMs();
#endif
  return result;
}

Trainer::Batches Trainer::openBatches() {
  Batches batches;
  batches.startEpoch = [this](int64_t e, int64_t seen) { loader_.startEpochAfter(e, seen); };
  batches.next = [this](runtime::data::Batch& b) { return loader_.next(b); };
#ifdef COHORT_HAVE_CUDA
  if (runtime::cuda::GpuContext* gpu = job_.gpu()) {
    batches.device = std::make_unique<runtime::data::DeviceLoader>(loader_, *gpu);
    runtime::data::DeviceLoader* device = batches.device.get();
    batches.startEpoch = [device](int64_t e, int64_t seen) { device->startEpochAfter(e, seen); };
    batches.next = [device](runtime::data::Batch& b) { return device->next(b); };
  }
#endif
  return batches;
}

void Trainer::startObserving() {
  if (timed()) {
    timeline_.start(options_.tracePath.empty() ? 0 : options_.traceSpans);
    if (!options_.tracePath.empty()) measureClocks(job_, timeline_);
    timeline_.takeTotals();  // the clock rounds are not the first epoch's
  }
  const ProgressMode mode = detectProgressMode(options_.progressEverySeconds);
  if (job_.world().rank != 0 || mode == ProgressMode::kOff) return;
  progress_ = std::make_unique<Progress>(ProgressOptions{.mode = mode,
                                                         .everySeconds = options_.progressEverySeconds,
                                                         .fd = 1,
                                                         .epochs = options_.epochs,
                                                         .stepsPerEpoch = stepsPerEpoch(),
                                                         .maxSteps = options_.maxSteps,
                                                         .samplesScale = job_.world().worldSize,
                                                         .clock = {},
                                                         .prefix = job_.log().prefix()});
}

int64_t Trainer::epochEndBatch() const {
  const int64_t end = loader_.endBatch();
  return options_.stepsPerEpoch > 0 ? std::min(end, options_.stepsPerEpoch * options_.accumulateSteps) : end;
}

int64_t Trainer::stepsPerEpoch() const {
  const int64_t k = options_.accumulateSteps, data = (loader_.batchesPerEpoch() + k - 1) / k;
  return options_.stepsPerEpoch > 0 ? std::min(data, options_.stepsPerEpoch) : data;
}

bool Trainer::runEpoch(Position& pos, Batches& batches, TrainResult& result) {
  const auto epochStart = Clock::now();
  const int64_t samplesBefore = pos.samples;
  pausedSeconds_ = 0;
  // From the samples the job has seen of the epoch, on whatever number of ranks (an elastic resume):
  // the same batches as from pos.batch where that number has not changed.
  batches.startEpoch(pos.epoch, pos.seen);
  pos.batch = loader_.firstBatch();
  const int64_t k = options_.accumulateSteps;
  StepGroup group;
  StepWindow window;
  timeline_.setStep(pos.step + 1);
  if (progress_) progress_->startEpoch(pos.epoch, (pos.batch + k - 1) / k);
  for (runtime::data::Batch batch; pos.batch < epochEndBatch();) {
    {
      Timeline::Scope span(timeline_, SpanKind::kData);  // the batch's wait is a span of its own
      if (!batches.next(batch)) break;
    }
    if (trainBatch(batch, pos, group, window, result)) break;
  }
  settleSteps(pos, window, 0);
  collectGpuSums(pos);  // also waits for the epoch's last step, so the time below includes it
  if (progress_) progress_->endEpoch();
  // Evaluations and samples within the epoch are not training time.
  finishEpoch(pos, result, std::max(0.0, secondsSince(epochStart) - pausedSeconds_), pos.samples - samplesBefore);
  return stopsAfterEpoch(pos, result);
}

bool Trainer::trainBatch(const runtime::data::Batch& batch, Position& pos, StepGroup& group, StepWindow& window,
                         TrainResult& result) {
  if (sampleLog_) logSamples(pos.epoch, batch.index);
  // Micro-batch `micro` of the optimizer step that starts at batch `first`: groups of K from where
  // the epoch started (0, or a resume point, which is a group boundary), the last one shorter when K
  // does not divide the rest. Only the group's last backward synchronises; the step averages the
  // group (Job::pass).
  const int64_t k = options_.accumulateSteps;
  const int64_t first = batch.index - (batch.index - loader_.firstBatch()) % k;
  const int micro = static_cast<int>(batch.index - first);
  const int groupSize = static_cast<int>(std::min(k, epochEndBatch() - first));
  const nn::Pass pass = job_.pass({.microBatch = micro, .microBatches = groupSize, .rng = &rng_});
  // On a GPU the losses stay on the device: the step checks the gradient only. There, unless told
  // otherwise, the step is deferred: its result is handled after the next step is queued (and its
  // device work joins the step's CUDA graph, train/step_graph.h).
  runtime::cuda::GpuContext* gpu = job_.gpu();
  double stepLoss = 0;
  StepResult stepped;
  const bool lastMicroBatch = micro + 1 == groupSize;
  forwardBackward(batch, pass, group, [&] {
    if (!lastMicroBatch) return;  // more micro-batches before this step
    stepLoss = group.loss / static_cast<double>(group.samples);
    stepped = job_.step({.clipGradNorm = options_.clipGradNorm,
                         .loss = gpu ? std::nullopt : std::optional<double>(stepLoss),
                         .lrAt = lrAt_,
                         .deferResult = gpu && !options_.synchronousSteps,
                         .skipNonFinite = options_.skipNonFinite - pos.skipped,
                         .skipSpikes = options_.skipSpikes,
                         .graph = stepGraph_.get()});
  });
  if (!lastMicroBatch) return false;
  ++pos.step;
  pos.batch = batch.index + 1;
  pos.seen = loader_.samplesSeenAfter(batch.index);
  timeline_.setStep(pos.step + 1);
  const QueuedStep queued{.epoch = pos.epoch, .step = pos.step, .firstBatch = first, .batch = batch.index, .nextBatch = pos.batch,
                          .samples = group.samples, .correct = group.correct, .groupLoss = group.loss, .loss = stepLoss};
  group = {};
  if (stepped.pending) {
    queued_.push_back(queued);
    settleSteps(pos, window, 1);
  } else {
    afterStep(pos, window, queued, stepped);
  }
  return stopsMidEpoch(pos, window, result);
}

std::unique_ptr<StepGraph> Trainer::makeStepGraph() {
  runtime::cuda::GpuContext* gpu = job_.gpu();
  if (!gpu) return nullptr;
  std::string off;
  if (!job_.world().isSingle() || job_.options().mode != Mode::kLocal) {
    off = "the multi-process modes are not captured (their gradient exchange waits on the host)";
  } else if (options_.accumulateSteps > 1) {
    off = "steps of several micro-batches are not captured";
  } else if (typeid(loss_) != typeid(nn::SoftmaxCrossEntropy) && typeid(loss_) != typeid(nn::MeanSquaredError)) {
    // A loss of one's own may decide on the host, step by step, what it enqueues: a replay would not.
    off = "the loss " + loss_.name() + " is not one of Cohort's (it may act on the host every step)";
  }
  // Only rank 0 says so where the reason is the run's, not the rank's.
  if (!off.empty() && job_.world().rank != 0) return nullptr;
  return std::make_unique<StepGraph>(*gpu, job_.log(),
                                     StepGraphOptions{.enabled = options_.cudaGraphs,
                                                      .offReason = off,
                                                      .rng = &rng_,
                                                      .withStep = !options_.synchronousSteps});
}

void Trainer::forwardBackward(const runtime::data::Batch& batch, const nn::Pass& pass, StepGroup& group,
                              const std::function<void()>& step) {
  runtime::cuda::GpuContext* gpu = job_.gpu();
  double batchLoss = std::numeric_limits<double>::quiet_NaN();
  // On a GPU the body enqueues work only (the loss stays on the device), so a CUDA graph may replay it.
  const auto body = [&](const runtime::data::Batch& b) {
    {
      Timeline::Scope span(timeline_, SpanKind::kForward);
      const Tensor& out = model_.forward(b.inputs, pass, gpu && loss_.readsBf16());
      if (gpu) {
        loss_.forwardGpu(out, b.targets, *gpu);
      } else {
        batchLoss = loss_.forward(out, b.targets);
        group.correct += loss_.correct();
      }
    }
    Timeline::Scope span(timeline_, SpanKind::kBackward);
    model_.backward(loss_.backward(), pass);
    // The test hook TestHooks::slowBackward (a test slows one rank's backward on purpose; host time,
    // so a graph's replay, which runs no host code, does not repeat it).
    if (const TestHooks::SlowBackward& slow = job_.options().testHooks.slowBackward; slow.rank == job_.world().rank) {
      std::this_thread::sleep_for(std::chrono::milliseconds(slow.ms));
    }
  };
  const auto afterBody = [&] {
    group.samples += batch.size;
    group.loss += batchLoss * static_cast<double>(batch.size);
    step();
  };
  if (stepGraph_) {
    stepGraph_->run(batch, body, afterBody);
  } else {
    body(batch);
    afterBody();
  }
}

bool Trainer::stopsMidEpoch(Position& pos, StepWindow& window, TrainResult& result) {
  settleCheckpoint(false);  // an asynchronous checkpoint committed as soon as every rank's file is durable
  const bool midEpoch = pos.batch < epochEndBatch();
  const bool maxStepsDue = options_.maxSteps > 0 && pos.step >= options_.maxSteps && midEpoch;
  const bool checkpointDue = options_.checkpointEvery > 0 && pos.step % options_.checkpointEvery == 0 && midEpoch;
  const bool evalDue = everyDue(options_.evalEverySteps, pos.step);
  const bool sampleDue = everyDue(options_.sampleEverySteps, pos.step);
  // Whatever reads the parameters or the step's figures waits for the queued steps first.
  if (maxStepsDue || checkpointDue || evalDue || sampleDue || stopVoteDue(pos.step)) settleSteps(pos, window, 0);
  // Before the checkpoint of this step, so that a run resumed from it does not repeat them; their
  // time is not the step window's.
  const double paused = pausedSeconds_;
  if (evalDue) {
    collectGpuSums(pos);  // the evaluation's passes share the loss's device sums: the training's first
    evaluateAtStep(pos);
  }
  if (sampleDue) sampleAtStep(pos.step);
  window.start += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(pausedSeconds_ - paused));
  if (stopAgreed(pos.step, false) && midEpoch) {
    settleSteps(pos, window, 0);
    if (progress_) progress_->clearLine();
    note() << "stop requested (" << stopCause() << "): checkpointing at step " << pos.step << " and stopping";
    collectGpuSums(pos);
    saveCheckpoint(pos);
    result.stoppedEarly = result.stoppedByRequest = true;
    result.stopReason = userStop_ ? StopReason::kCallback : StopReason::kRequest;
    return true;
  }
  if (maxStepsDue) {
    collectGpuSums(pos);
    saveCheckpoint(pos);
    result.stoppedEarly = true;
    result.stopReason = StopReason::kMaxSteps;
    return true;
  }
  if (checkpointDue) {
    collectGpuSums(pos);
    saveCheckpoint(pos);
  }
  return false;
}

bool Trainer::stopsAfterEpoch(const Position& pos, TrainResult& result) {
  if (result.stoppedByRequest) return true;
  if (result.stoppedEarly || (options_.maxSteps > 0 && pos.step >= options_.maxSteps && pos.epoch + 1 < options_.epochs)) {
    result.stoppedEarly = true;
    result.stopReason = StopReason::kMaxSteps;
    note() << "stopped after " << pos.step << " steps (--max-steps)";
    return true;
  }
  if (pos.epoch + 1 < options_.epochs && stopAgreed(pos.step, true)) {
    note() << "stop requested (" << stopCause() << "): stopping after epoch " << pos.epoch + 1
           << (options_.checkpointPath.empty() ? "" : " (checkpointed)");
    result.stoppedEarly = result.stoppedByRequest = true;
    result.stopReason = userStop_ ? StopReason::kCallback : StopReason::kRequest;
    return true;
  }
  return false;
}

void Trainer::finishRun(TrainResult& result, Clock::time_point start) {
  settleCheckpoint(true);
  if (!options_.tracePath.empty()) {
    const auto merge = Clock::now();
    writeTrace(job_, timeline_, options_.tracePath, job_.options().testHooks.clockSkewNs(job_.world().rank));
    if (job_.world().rank == 0) {
      job_.log().info() << "trace of " << job_.world().worldSize << " rank(s) merged in " << secondsSince(merge)
                 << " s and written to " << options_.tracePath << " (open it in https://ui.perfetto.dev or chrome://tracing)";
    }
  }
  result.wallSeconds = secondsSince(start);
  // A metrics line that could not be written stopped the run like a failed checkpoint (after it).
  if (metrics_ && !metrics_->failure().empty()) {
    COHORT_THROW(IoError) << metrics_->failure() << " (the run stopped at step " << result.steps
                          << (options_.checkpointPath.empty() ? "" : ", checkpointed") << ")";
  }
}

void Trainer::collectGpuSums(Position& pos) {
  if (!job_.gpu()) return;
  nn::LossSums sums = loss_.takeGpuSums(*job_.gpu());
  pos.lossSum += sums.loss;
  pos.correct += sums.correct;
}

bool Trainer::stopAgreed(int64_t step, bool epochEnd) {
  const bool mine = userStop_ || (options_.stopRequested && options_.stopRequested->load(std::memory_order_relaxed));
  if (job_.world().isSingle()) return mine;
  if (!epochEnd && !stopVoteDue(step)) return false;
  return job_.any(mine);
}

void Trainer::finishEpoch(Position& pos, TrainResult& result, double epochSeconds, int64_t epochSamples) {
  std::optional<StepTimes> times;
  if (timed()) times = gatherStepTimes(job_, timeline_.takeTotals(), epochSeconds);
  trainSeconds_ += epochSeconds;
  trainedSamples_ += epochSamples;
  if (epochsRun_++ > 0) {  // after the warm-up (TrainResult::samplesPerSecSteady)
    steadySeconds_ += epochSeconds;
    steadySamples_ += epochSamples;
  }
  EpochReport report = jobFigures(pos, result, epochSeconds, epochSamples, times);  // a callback may add metrics
  if (callbacks_.onEpochEnd && callbacks_.onEpochEnd(report) == Next::kStop) userStop_ = true;
  if (report.times && job_.world().rank == 0) {
    job_.log().info() << "epoch " << pos.epoch + 1 << " " << describe(*report.times, job_.world().worldSize);
  }
  if (metrics_) metrics_->epoch(report, classification_);
  if (metrics_ && !metrics_->failure().empty()) userStop_ = true;  // stop, checkpointed (run() throws)
  startEpochFigures(pos, result);
  if (!result.stoppedEarly) {
    Position next = pos;
    next.epoch = pos.epoch + 1;
    next.batch = next.seen = 0;
    saveCheckpoint(next);
  }
  job_.barrier("after epoch " + std::to_string(pos.epoch + 1));
  timeline_.takeTotals();  // evaluation, checkpoint and this barrier are not the next epoch's steps
  logEpoch(report, epochSeconds, epochSamples);  // once every rank has finished the epoch
}

EpochReport Trainer::jobFigures(const Position& pos, TrainResult& result, double epochSeconds, int64_t epochSamples,
                                const std::optional<StepTimes>& times) {
  // An epoch cut short by a stop is reported (its figures so far) but not counted as completed.
  result.epochs = result.stoppedEarly ? pos.epoch : pos.epoch + 1;
  result.steps = pos.step;
  // The job's figures: samples summed, the time the slowest rank's, loss and accuracy averaged (every
  // rank trains the same number of samples per epoch, so the mean of the ranks' means is the job's).
  // [0] the run's samples, [1] this epoch's, [4] the run's after its first epoch: summed; the same
  // times ([0], [1], [5]): the slowest rank's.
  // The gradient's norm is the same on every rank that steps together (Hogwild: each worker's own,
  // averaged); skipped steps are the job's where ranks skip together, and summed over Hogwild workers.
  const double lockstep = job_.lockstep() ? 1 : 0;
  const auto skipped = static_cast<double>(pos.skippedInEpoch), spikes = static_cast<double>(pos.spikesInEpoch);
  double samples[5] = {static_cast<double>(trainedSamples_), static_cast<double>(epochSamples),
                       (1 - lockstep) * skipped, (1 - lockstep) * spikes, static_cast<double>(steadySamples_)};
  double maxes[6] = {trainSeconds_,      epochSeconds,      pos.gradNormMax,
                     lockstep * skipped, lockstep * spikes, steadySeconds_};
  double means[3] = {pos.samples ? pos.lossSum / static_cast<double>(pos.samples) : 0,
                     pos.samples ? static_cast<double>(pos.correct) / static_cast<double>(pos.samples * loss_.positions()) : 0,
                     pos.gradNormSteps ? pos.gradNormSum / static_cast<double>(pos.gradNormSteps) : 0};
  job_.reduce(samples, Reduce::kSum);
  job_.reduce(maxes, Reduce::kMax);
  job_.reduce(means, Reduce::kMean);
  const double* seconds = maxes;
  result.trainLoss = means[0];
  result.trainAcc = means[1];
  result.samplesPerSec = seconds[0] > 0 ? samples[0] / seconds[0] : 0;
  result.samplesPerSecSteady = seconds[5] > 0 ? samples[4] / seconds[5] : result.samplesPerSec;
  result.skippedSteps = pos.skipped;
  result.skippedSpikes = pos.spikes;
  const double epochJobPerSec = seconds[1] > 0 ? samples[1] / seconds[1] : 0;
  if (std::optional<Evaluation> e = evaluateForEpoch(pos)) {  // rank 0's; every rank takes part
    result.testLoss = e->loss;
    result.testAcc = e->accuracy;
    result.haveTest = true;
  }
  EpochReport report{.epoch = pos.epoch + 1, .step = pos.step, .trainLoss = result.trainLoss,
                     .trainAcc = result.trainAcc, .testLoss = result.testLoss, .testAcc = result.testAcc,
                     .haveTest = result.haveTest, .samplesPerSec = result.samplesPerSec,
                     .epochSamplesPerSec = epochJobPerSec, .lr = job_.optimizer().options().lr,
                     .gradNorm = means[2], .gradNormMax = maxes[2],
                     .skippedSteps = static_cast<int64_t>(samples[2] + maxes[3]),
                     .skippedSpikes = static_cast<int64_t>(samples[3] + maxes[4]),
                     .metrics = {},
                     .times = times};
  return report;
}

void Trainer::startEpochFigures(Position& pos, const TrainResult& result) {
  pos.lastTrainLoss = result.trainLoss;
  pos.lastTrainAcc = result.trainAcc;
  pos.lossSum = 0;
  pos.correct = 0;
  pos.samples = 0;
  pos.gradNormSum = pos.gradNormMax = 0;
  pos.gradNormSteps = pos.skippedInEpoch = pos.spikesInEpoch = 0;
}

TrainResult Trainer::alreadyDone(const Position& pos, Clock::time_point start) {
  TrainResult result;
  if (pos.epoch < options_.epochs) {  // at maxSteps within the run
    result.stoppedEarly = true;
    result.stopReason = StopReason::kMaxSteps;
  }
  result.epochs = pos.epoch;
  result.steps = pos.step;
  result.skippedSteps = pos.skipped;
  result.skippedSpikes = pos.spikes;
  result.trainLoss = pos.lastTrainLoss;
  result.trainAcc = pos.lastTrainAcc;
  if (std::optional<Evaluation> e = evaluateTestPrefix(evalSamples())) {  // rank 0's; every rank takes part
    result.testLoss = e->loss;
    result.testAcc = e->accuracy;
    result.haveTest = true;
  }
  result.wallSeconds = secondsSince(start);
  return result;
}

Evaluation Trainer::evaluate(const runtime::data::Dataset& data) {
  const int64_t chunk = evaluationChunk(model_, options_.evalBatchSize), chunks = chunkCount(data.size(), chunk);
  std::vector<double> sums(2 * static_cast<size_t>(chunks), 0.0);
  evaluateChunks(data, chunk, 0, chunks, sums);
  return evaluationOf(sums, data.size(), loss_.positions());
}

std::optional<Evaluation> Trainer::evaluateTest() { return evaluateTestPrefix(0); }

std::optional<Evaluation> Trainer::evaluateTestPrefix(int64_t samples) {
  const int rank = job_.world().rank, ranks = job_.world().worldSize;
  // Shared when every rank holds the same test set and chunks it alike (testKey_, in three 16-bit
  // parts): the largest of each part (-1: none) and of minus each (+1 where a rank holds none) agree.
  // Else rank 0 alone, as with --test-data differing per rank.
  double keys[6];
  for (int i = 0; i < 3; ++i) {
    const double part = test_ ? static_cast<double>((testKey_ >> (16 * i)) & 0xffff) : -1.0;
    keys[i] = part;
    keys[3 + i] = test_ ? -part : 1.0;
  }
  if (ranks > 1) job_.reduce(keys, Reduce::kMax);
  bool shared = ranks > 1;
  for (int i = 0; i < 3; ++i) shared = shared && keys[i] >= 0 && -keys[3 + i] == keys[i];
  // ZeRO 3: every unit gathered for the evaluation's passes, which the ranks run unevenly.
  const Job::ParamsGathered gathered = job_.gatherParams();
  if (!shared && (!test_ || rank != 0)) return std::nullopt;
  Timeline::Scope span(timeline_, SpanKind::kEvaluate);
  // A prefix of whole chunks (or the whole set): the chunks are the whole set's first ones.
  const int64_t n = samples > 0 ? std::min(samples, test_->size()) : test_->size();
  const int64_t chunk = evaluationChunk(model_, options_.evalBatchSize), chunks = chunkCount(n, chunk);
  const int64_t first = shared ? chunks * rank / ranks : 0, last = shared ? chunks * (rank + 1) / ranks : chunks;
  // The last piece: the loss's positions per sample from the rank that evaluated chunk 0 (a rank
  // that evaluated nothing, e.g. before the first step, does not know them).
  std::vector<double> sums(2 * static_cast<size_t>(chunks), 0.0), pieces(kPiecesPerSum * sums.size() + 1, 0.0);
  evaluateChunks(*test_, chunk, first, last, sums);
  if (!shared) return evaluationOf(sums, n, loss_.positions());
  if (first == 0 && last > 0) pieces.back() = static_cast<double>(loss_.positions());
  // Job::reduce may go through float32 (ReplicaPlacement): the sums cross it as whole numbers.
  const size_t mine = 2 * static_cast<size_t>(first), count = 2 * static_cast<size_t>(last - first);
  splitSums(std::span<const double>(sums).subspan(mine, count),
            std::span<double>(pieces).subspan(kPiecesPerSum * mine, kPiecesPerSum * count));
  job_.reduce(pieces, Reduce::kSum);  // each chunk's from the one rank that has it, 0 from the others
  if (rank != 0) return std::nullopt;
  const auto positions = static_cast<int64_t>(pieces.back());
  pieces.pop_back();
  joinSums(pieces, sums);
  return evaluationOf(sums, n, positions);
}

void Trainer::evaluateChunks(const runtime::data::Dataset& data, int64_t chunk, int64_t first, int64_t last,
                             std::span<double> sums) {
#ifdef COHORT_HAVE_CUDA
  if (job_.gpu()) {
    // Chunks are copied to the device one at a time, and each chunk's sums read back (evaluation
    // is not the hot loop).
    const nn::Pass pass = job_.evalPass();
    const int64_t n = data.size();
    auto& gpu = *job_.gpu();
    Tensor inputs, targets;
    for (int64_t c = first; c < last; ++c) {
      const int64_t begin = c * chunk, count = std::min(chunk, n - begin);
      const runtime::data::Dataset::Rows rows = data.rows(begin, count);
      const Tensor &hostIn = rows.inputs, &hostTgt = rows.targets;
      runtime::ensureShape(inputs, hostIn.shape(), gpu.allocator());
      runtime::ensureShape(targets, hostTgt.shape(), gpu.allocator());
      runtime::cuda::copyToDevice(inputs.data(), hostIn.data(), hostIn.bytes(), gpu.stream());
      runtime::cuda::copyToDevice(targets.data(), hostTgt.data(), hostTgt.bytes(), gpu.stream());
      loss_.forwardGpu(model_.forward(inputs, pass, loss_.readsBf16()), targets, gpu);
      model_.net->checkInputs(pass);  // bad ids are NaN rows on a GPU: refused here as on the CPU
      const nn::LossSums s = loss_.takeGpuSums(gpu);  // waits for the chunk's kernels
      sums[static_cast<size_t>(2 * c)] = s.loss;
      sums[static_cast<size_t>(2 * c + 1)] = static_cast<double>(s.correct);
    }
    return;
  }
#endif
  train::evaluateChunks(model_, loss_, data, chunk, first, last, sums);
}

}  // namespace cohort::train
