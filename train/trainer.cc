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
#include <vector>

#include "runtime/digest.h"
#include "runtime/error.h"
#include "train/checkpointer.h"
#include "train/metrics_sink.h"
#include "train/progress.h"
#include "train/trace_file.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#include "runtime/data/device_loader.h"
#endif

namespace cohort::train {

using runtime::Tensor;

namespace {

runtime::data::DataLoaderOptions loaderOptions(const Job& job, const TrainerOptions& o) {
  return job.shard({.batchSize = o.batchSize, .seed = o.seed, .prefetch = o.prefetch, .augment = o.augment});
}

// A digest of the training set that costs microseconds: every target, and the inputs of 64 samples
// spread over the set. Two ranks reading different files of one name and size differ here.
std::string sampledDigest(const runtime::data::Dataset& d) {
  runtime::Digest digest;
  const int64_t n = d.size(), per = d.sampleShape().numel(), perTarget = d.targetShape().numel();
  std::vector<float> input(static_cast<size_t>(per)), target(static_cast<size_t>(perTarget));
  if (d.held()) {
    digest.add(d.targets().data(), static_cast<size_t>(d.targets().numel()) * sizeof(float));
  } else {  // made on demand (token shards): the names and sizes, and the 64 samples' targets below
    digest.add(d.name() + "/" + std::to_string(n));
  }
  for (int64_t k = 0; k < 64 && n > 0; ++k) {
    d.read(k * n / 64, input.data(), target.data());
    digest.add(input.data(), input.size() * sizeof(float));
    if (!d.held()) digest.add(target.data(), target.size() * sizeof(float));
  }
  return digest.hex();
}

// The test set and its evaluation chunk as a whole number below 2^48, for Trainer::evaluateTest to
// see whether every rank holds the same.
uint64_t testKey(const runtime::data::Dataset& test, int64_t chunk) {
  const std::string hex = runtime::Digest()
                              .add(sampledDigest(test))
                              .add(std::to_string(test.size()) + "/" + std::to_string(chunk))
                              .hex();
  return std::stoull(hex.substr(0, 12), nullptr, 16);
}

// What the ranks of one Trainer must share (Job::agree); the prefetch depth, the evaluation batch
// and the metrics file may differ per rank.
Settings trainerSettings(const runtime::data::Dataset& train, const TrainerOptions& o, const nn::LrSchedule* schedule) {
  return {{"train_data", train.name()},
          {"train_samples", std::to_string(train.size())},
          {"sample_shape", train.sampleShape().str()},
          {"train_data_digest", sampledDigest(train)},
          {"epochs", std::to_string(o.epochs)},
          {"batch_size", std::to_string(o.batchSize)},
          {"data_seed", std::to_string(o.seed)},
          {"augment", "crop padding " + std::to_string(o.augment.cropPadding) + (o.augment.horizontalFlip ? ", flip" : "")},
          {"classification", o.classification ? "yes" : "no"},
          {"checkpoint", o.checkpointPath},
          {"checkpoint_every", std::to_string(o.checkpointEvery)},
          {"resume", o.resume ? "yes" : "no"},
          {"max_steps", std::to_string(o.maxSteps)},
          {"accumulate_steps", std::to_string(o.accumulateSteps)},
          {"lr_schedule", schedule ? schedule->describe() : "none"},
          {"clip_grad_norm", std::to_string(o.clipGradNorm)},
          {"skip_nonfinite", std::to_string(o.skipNonFinite)},
          {"skip_spikes", std::to_string(o.skipSpikes) + ", " + std::to_string(o.maxSpikesInARow) + " in a row"}};
}

// The schedule with the run's defaults filled in (see TrainerOptions::lrSchedule).
std::optional<nn::LrSchedule> makeSchedule(const TrainerOptions& o, const nn::Optimizer& optimizer,
                                           int64_t batchesPerEpoch) {
  if (!o.lrSchedule) return std::nullopt;
  nn::LrScheduleOptions s = *o.lrSchedule;
  if (s.baseLr == 0) s.baseLr = optimizer.options().lr;
  // Over the epochs, whatever maxSteps says: a run stopped by maxSteps and resumed follows the same
  // schedule as one that never stopped.
  if (s.totalSteps == 0) s.totalSteps = o.epochs * ((batchesPerEpoch + o.accumulateSteps - 1) / o.accumulateSteps);
  return nn::LrSchedule(s);
}

const Job& placedJob(const Job& job) {
  if (!job.placed()) COHORT_THROW(InvalidArgument) << "a Trainer needs a job whose model is placed: call Job::place() first";
  return job;
}

}  // namespace

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

Trainer::Trainer(Job& job, nn::Loss& loss, const runtime::data::Dataset& train, const runtime::data::Dataset* test,
                 TrainerOptions options, TrainerCallbacks callbacks)
    : job_(job),
      model_(placedJob(job).model()),
      loss_(loss),
      loader_(train, loaderOptions(job, options)),
      test_(test),
      testKey_(test ? testKey(*test, evaluationChunk(model_, options.evalBatchSize)) : 0),
      options_(std::move(options)),
      callbacks_(std::move(callbacks)),
      rng_(runtime::mix(options_.seed + static_cast<uint64_t>(job.world().rank), 0x64726f70ull /* "drop" */)),
      timeline_(job.timeline()) {
  openSampleLog();
  loss_.setGradType(job_.options().precision);  // bf16 passes: the gradient the model's bf16 head reads
  if (const char* slow = std::getenv("COHORT_TEST_SLOW_BACKWARD")) {
    if (std::sscanf(slow, "%d:%d", &slowRank_, &slowBackwardMs_) != 2) {
      COHORT_THROW(InvalidArgument) << "COHORT_TEST_SLOW_BACKWARD must be RANK:MS, got '" << slow << "'";
    }
  }
  if (!(options_.progressEverySeconds >= 0) || !std::isfinite(options_.progressEverySeconds)) {
    COHORT_THROW(InvalidArgument) << "progressEverySeconds must be a finite number >= 0 (0: no progress), got "
                                  << options_.progressEverySeconds;
  }
  if (!job_.lockstep() && (options_.checkpointEvery > 0 || options_.maxSteps > 0)) {
    COHORT_THROW(InvalidArgument) << "checkpointEvery and maxSteps need ranks that step together: Hogwild workers meet "
                                     "(and checkpoint) only at the end of each epoch";
  }
  if (options_.epochs <= 0) COHORT_THROW(InvalidArgument) << "epochs must be positive, got " << options_.epochs;
  if (options_.accumulateSteps < 1) {
    COHORT_THROW(InvalidArgument) << "accumulateSteps must be at least 1, got " << options_.accumulateSteps;
  }
  if (!(options_.clipGradNorm >= 0) || !std::isfinite(options_.clipGradNorm)) {
    COHORT_THROW(InvalidArgument) << "clipGradNorm must be a finite number >= 0 (0: no clipping), got "
                                  << options_.clipGradNorm;
  }
  if (options_.skipNonFinite < 0) {
    COHORT_THROW(InvalidArgument) << "skipNonFinite must be >= 0, got " << options_.skipNonFinite;
  }
  if (!(options_.skipSpikes >= 0) || !std::isfinite(options_.skipSpikes) || options_.maxSpikesInARow < 0) {
    COHORT_THROW(InvalidArgument) << "skipSpikes must be a finite number >= 0 (0: off) and maxSpikesInARow >= 0, got "
                                  << options_.skipSpikes << " and " << options_.maxSpikesInARow;
  }
  if ((options_.resume || options_.checkpointEvery > 0) && options_.checkpointPath.empty()) {
    COHORT_THROW(InvalidArgument) << (options_.resume ? "resume" : "checkpointEvery") << " needs a checkpoint path";
  }
  schedule_ = makeSchedule(options_, job_.optimizer(), loader_.batchesPerEpoch());
  job_.agree(trainerSettings(train, options_, lrSchedule()));
  prepareOutputs();
}

// Rank 0 writes the checkpoints, the trace and the TensorBoard file: find out now, not after an epoch
// of training, that it cannot. Every rank learns the verdict (a collective), so none waits for a
// rank 0 that is gone.
void Trainer::prepareOnRankZero(const std::function<void()>& prepare, const std::string& what) {
  std::string problem;
  if (job_.world().rank == 0) {
    try {
      prepare();
    } catch (const IoError& e) {
      problem = e.what();
    }
  }
  if (!job_.any(!problem.empty())) return;
  if (!problem.empty()) throw IoError(problem);
  COHORT_THROW(IoError) << "rank 0 cannot write " << what << " (its message says why)";
}

void Trainer::prepareOutputs() {
  if (!options_.checkpointPath.empty()) {
    // Clears what killed writers left there.
    prepareOnRankZero(
        [&] {
          const size_t removed = nn::prepareCheckpointDestination(options_.checkpointPath);  // the directory first
          if (!checkpointLock_) checkpointLock_.emplace(options_.checkpointPath);  // one run per checkpoint path
          if (removed) {
            job_.log().info() << "removed " << removed << " temporary checkpoint file(s) of " << options_.checkpointPath
                              << " left by writers that were killed";
          }
        },
        "checkpoints to " + options_.checkpointPath);
  }
  // Every output file the same way (nn::checkOutputFile): its directory must exist, nothing is created.
  if (!options_.tracePath.empty()) {
    prepareOnRankZero([&] { nn::checkOutputFile(options_.tracePath, "the trace"); }, "the trace to " + options_.tracePath);
  }
  if (!options_.metricsPath.empty() || !options_.tensorboardDir.empty()) {
    prepareOnRankZero(
        [&] {
          if (!options_.metricsPath.empty()) nn::checkOutputFile(options_.metricsPath, "metrics");
          metrics_ = std::make_unique<MetricsSink>(options_.metricsPath, options_.tensorboardDir);
        },
        "metrics to " + (options_.tensorboardDir.empty() ? options_.metricsPath : options_.tensorboardDir));
  }
}

Trainer::~Trainer() = default;

std::string Trainer::stopCause() const {
  if (userStop_) return "by a callback";
  if (!options_.stopRequested || !options_.stopRequested->load(std::memory_order_relaxed)) return "on another rank";
  const int signal = options_.stopSignal ? options_.stopSignal->load(std::memory_order_relaxed) : 0;
  if (signal == 0) return "a stop request";
  const char* name = ::sigabbrev_np(signal);
  return name ? std::string("SIG") + name : "signal " + std::to_string(signal);
}

TrainResult Trainer::run() {
  const auto start = Clock::now();
  const runtime::Logger& log = job_.log();
  Position pos;
  if (options_.resume && loadCheckpoint(pos)) {
    log.info() << "resumed from " << options_.checkpointPath << " at epoch " << pos.epoch + 1 << " batch " << pos.batch
               << " (step " << pos.step << ")";
  }
  TrainResult result;
  if (pos.epoch >= options_.epochs) return alreadyDone(pos, start);
  runtime::cuda::GpuContext* gpu = job_.gpu();
  // Batches come from the host loader, or on a GPU through the device loader that copies them ahead.
  std::function<void(int64_t, int64_t)> startEpoch = [&](int64_t e, int64_t seen) { loader_.startEpochAfter(e, seen); };
  std::function<bool(runtime::data::Batch&)> nextBatch = [&](runtime::data::Batch& b) { return loader_.next(b); };
#ifdef COHORT_HAVE_CUDA
  std::unique_ptr<runtime::data::DeviceLoader> deviceBatches;
  if (gpu) {
    deviceBatches = std::make_unique<runtime::data::DeviceLoader>(loader_, *gpu);
    startEpoch = [&](int64_t e, int64_t seen) { deviceBatches->startEpochAfter(e, seen); };
    nextBatch = [&](runtime::data::Batch& b) { return deviceBatches->next(b); };
  }
#endif
  job_.barrier("start");
  if (timed()) {
    timeline_.start(options_.tracePath.empty() ? 0 : options_.traceSpans);
    if (!options_.tracePath.empty()) measureClocks(job_, timeline_);
    timeline_.takeTotals();  // the clock rounds are not the first epoch's
  }
  const int64_t stepsPerEpoch = (loader_.batchesPerEpoch() + options_.accumulateSteps - 1) / options_.accumulateSteps;
  if (const ProgressMode mode = detectProgressMode(options_.progressEverySeconds);
      job_.world().rank == 0 && mode != ProgressMode::kOff) {
    progress_ = std::make_unique<Progress>(ProgressOptions{.mode = mode,
                                                           .everySeconds = options_.progressEverySeconds,
                                                           .fd = 1,
                                                           .epochs = options_.epochs,
                                                           .stepsPerEpoch = stepsPerEpoch,
                                                           .maxSteps = options_.maxSteps,
                                                           .samplesScale = job_.world().worldSize,
                                                           .clock = {},
                                                           .prefix = log.prefix()});
  }
  // The batch's wait is a span of its own (nothing when the timeline is off).
  auto fetch = [&](runtime::data::Batch& b) {
    Timeline::Scope span(timeline_, SpanKind::kData);
    return nextBatch(b);
  };
  // The schedule is a pure function of the optimizer's step count, which checkpoints hold: a resumed
  // run continues it exactly.
  std::function<float(int64_t)> lrAt;
  if (schedule_) lrAt = [this](int64_t steps) { return schedule_->lrAt(steps); };
  const bool deferSteps = gpu && !options_.synchronousSteps;
  for (; pos.epoch < options_.epochs; ++pos.epoch, pos.batch = pos.seen = 0) {
    const auto epochStart = Clock::now();
    const int64_t samplesBefore = pos.samples;
    // From the samples the job has seen of the epoch, on whatever number of ranks (an elastic resume):
    // the same batches as from pos.batch where that number has not changed.
    startEpoch(pos.epoch, pos.seen);
    pos.batch = loader_.firstBatch();
    const int64_t batches = loader_.endBatch(), k = options_.accumulateSteps;
    // The step's figures, added to the epoch's once it is applied (a skipped step counts in none).
    int64_t groupSamples = 0, groupCorrect = 0;
    double groupLoss = 0;
    StepWindow window;
    timeline_.setStep(pos.step + 1);
    if (progress_) progress_->startEpoch(pos.epoch, (pos.batch + k - 1) / k);
    for (runtime::data::Batch batch; fetch(batch);) {
      if (sampleLog_) logSamples(pos.epoch, batch.index);
      // Micro-batch `micro` of the optimizer step that starts at batch `first`: groups of K from
      // where the epoch started (0, or a resume point, which is a group boundary), the last one
      // shorter when K does not divide the rest. Only the group's last backward synchronises; the
      // step averages the group (Job::pass).
      const int64_t first = batch.index - (batch.index - loader_.firstBatch()) % k;
      const int micro = static_cast<int>(batch.index - first), group = static_cast<int>(std::min(k, batches - first));
      const nn::Pass pass = job_.pass({.microBatch = micro, .microBatches = group, .rng = &rng_});
      double batchLoss = std::numeric_limits<double>::quiet_NaN();
      {
        Timeline::Scope span(timeline_, SpanKind::kForward);
        const Tensor& out = model_.forward(batch.inputs, pass, gpu && loss_.readsBf16());
        if (gpu) {
          loss_.forwardGpu(out, batch.targets, *gpu);
        } else {
          batchLoss = loss_.forward(out, batch.targets);
          groupCorrect += loss_.correct();
        }
      }
      groupSamples += batch.size;
      groupLoss += batchLoss * static_cast<double>(batch.size);
      {
        Timeline::Scope span(timeline_, SpanKind::kBackward);
        model_.backward(loss_.backward(), pass);
        if (slowRank_ == job_.world().rank) std::this_thread::sleep_for(std::chrono::milliseconds(slowBackwardMs_));
      }
      if (micro + 1 < group) continue;  // more micro-batches before this step
      // On a GPU the losses stay on the device: the step checks the gradient only. There, unless
      // told otherwise, the step is deferred: its result is handled after the next step is queued.
      const double stepLoss = groupLoss / static_cast<double>(groupSamples);
      const StepResult stepped = job_.step({.clipGradNorm = options_.clipGradNorm,
                                            .loss = gpu ? std::nullopt : std::optional<double>(stepLoss),
                                            .lrAt = lrAt,
                                            .deferResult = deferSteps,
                                            .skipNonFinite = options_.skipNonFinite - pos.skipped,
                                            .skipSpikes = options_.skipSpikes});
      ++pos.step;
      pos.batch = batch.index + 1;
      pos.seen = loader_.samplesSeenAfter(batch.index);
      timeline_.setStep(pos.step + 1);
      const QueuedStep queued{.epoch = pos.epoch, .step = pos.step, .firstBatch = first, .batch = batch.index, .nextBatch = pos.batch,
                              .samples = groupSamples, .correct = groupCorrect, .groupLoss = groupLoss, .loss = stepLoss};
      groupSamples = 0;
      groupCorrect = 0;
      groupLoss = 0;
      if (stepped.pending) {
        queued_.push_back(queued);
        settleSteps(pos, window, 1);
      } else {
        afterStep(pos, window, queued, stepped);
      }
      const bool midEpoch = pos.batch < batches;
      const bool maxStepsDue = options_.maxSteps > 0 && pos.step >= options_.maxSteps && midEpoch;
      const bool checkpointDue = options_.checkpointEvery > 0 && pos.step % options_.checkpointEvery == 0 && midEpoch;
      // Whatever reads the parameters or the step's figures waits for the queued steps first.
      if (maxStepsDue || checkpointDue || stopVoteDue(pos.step)) settleSteps(pos, window, 0);
      if (stopAgreed(pos.step, false) && midEpoch) {
        settleSteps(pos, window, 0);
        if (progress_) progress_->clearLine();
        log.info() << "stop requested (" << stopCause() << "): checkpointing at step "
                   << pos.step << " and stopping";
        collectGpuSums(pos);
        saveCheckpoint(pos);
        result.stoppedEarly = result.stoppedByRequest = true;
        result.stopReason = userStop_ ? StopReason::kCallback : StopReason::kRequest;
        break;
      }
      if (maxStepsDue) {
        collectGpuSums(pos);
        saveCheckpoint(pos);
        result.stoppedEarly = true;
        result.stopReason = StopReason::kMaxSteps;
        break;
      }
      if (checkpointDue) {
        collectGpuSums(pos);
        saveCheckpoint(pos);
      }
    }
    settleSteps(pos, window, 0);
    collectGpuSums(pos);  // also waits for the epoch's last step, so the time below includes it
    if (progress_) progress_->endEpoch();
    finishEpoch(pos, result, secondsSince(epochStart), pos.samples - samplesBefore);
    if (result.stoppedByRequest) break;
    if (result.stoppedEarly || (options_.maxSteps > 0 && pos.step >= options_.maxSteps && pos.epoch + 1 < options_.epochs)) {
      result.stoppedEarly = true;
      result.stopReason = StopReason::kMaxSteps;
      log.info() << "stopped after " << pos.step << " steps (--max-steps)";
      break;
    }
    if (pos.epoch + 1 < options_.epochs && stopAgreed(pos.step, true)) {
      log.info() << "stop requested (" << stopCause() << "): stopping after epoch "
                 << pos.epoch + 1 << (options_.checkpointPath.empty() ? "" : " (checkpointed)");
      result.stoppedEarly = result.stoppedByRequest = true;
      result.stopReason = userStop_ ? StopReason::kCallback : StopReason::kRequest;
      break;
    }
  }
  progress_.reset();  // erases a line still showing
  if (!options_.tracePath.empty()) {
    const auto merge = Clock::now();
    writeTrace(job_, timeline_, options_.tracePath);
    if (job_.world().rank == 0) {
      log.info() << "trace of " << job_.world().worldSize << " rank(s) merged in " << secondsSince(merge)
                 << " s and written to " << options_.tracePath << " (open it in https://ui.perfetto.dev or chrome://tracing)";
    }
  }
  result.wallSeconds = secondsSince(start);
#ifdef COHORT_HAVE_CUDA
  if (deviceBatches) result.inputWaitMs = deviceBatches->inputWaitMs();
#endif
  return result;
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
  // An epoch cut short by a stop is reported (its figures so far) but not counted as completed.
  result.epochs = result.stoppedEarly ? pos.epoch : pos.epoch + 1;
  result.steps = pos.step;
  // The job's figures: samples summed, the time the slowest rank's, loss and accuracy averaged (every
  // rank trains the same number of samples per epoch, so the mean of the ranks' means is the job's).
  // [0] the run's samples, [1] this epoch's: summed; the same two times: the slowest rank's.
  // The gradient's norm is the same on every rank that steps together (Hogwild: each worker's own,
  // averaged); skipped steps are the job's where ranks skip together, and summed over Hogwild workers.
  const double lockstep = job_.lockstep() ? 1 : 0;
  const auto skipped = static_cast<double>(pos.skippedInEpoch), spikes = static_cast<double>(pos.spikesInEpoch);
  double samples[4] = {static_cast<double>(trainedSamples_), static_cast<double>(epochSamples),
                       (1 - lockstep) * skipped, (1 - lockstep) * spikes};
  double maxes[5] = {trainSeconds_, epochSeconds, pos.gradNormMax, lockstep * skipped, lockstep * spikes};
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
  result.skippedSteps = pos.skipped;
  result.skippedSpikes = pos.spikes;
  const double epochJobPerSec = seconds[1] > 0 ? samples[1] / seconds[1] : 0;
  if (std::optional<Evaluation> e = evaluateTest()) {  // rank 0's; every rank takes part
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
  if (callbacks_.onEpochEnd && callbacks_.onEpochEnd(report) == Next::kStop) userStop_ = true;
  auto line = job_.log().info();
  line << "epoch " << pos.epoch + 1 << "/" << options_.epochs << " step " << pos.step << " train_loss " << result.trainLoss;
  if (options_.classification) line << " train_acc " << result.trainAcc;
  if (result.haveTest) line << " test_loss " << result.testLoss;
  // A language model's loss is per token (nats): its perplexity beside it.
  if (result.haveTest && loss_.positions() > 1) line << " test_ppl " << std::exp(result.testLoss);
  if (result.haveTest && options_.classification) line << " test_acc " << result.testAcc;
  line << " grad_norm " << report.gradNorm;
  if (report.skippedSteps > 0) line << " skipped_steps " << report.skippedSteps;
  if (report.skippedSpikes > 0) line << " skipped_spikes " << report.skippedSpikes;
  for (const auto& [name, value] : report.metrics) line << " " << name << " " << value;
  line << " samples/s " << static_cast<int64_t>(epochSeconds > 0 ? static_cast<double>(epochSamples) / epochSeconds : 0);
  if (loss_.positions() > 1) {
    line << " tokens/s "
         << static_cast<int64_t>(epochSeconds > 0 ? static_cast<double>(epochSamples * loss_.positions()) / epochSeconds : 0);
  }
  if (job_.options().mode != Mode::kLocal) line << " (job " << static_cast<int64_t>(epochJobPerSec) << ")";
  if (report.times && job_.world().rank == 0) {
    job_.log().info() << "epoch " << pos.epoch + 1 << " " << describe(*report.times, job_.world().worldSize);
  }
  if (metrics_) metrics_->epoch(report, options_.classification);
  pos.lastTrainLoss = result.trainLoss;
  pos.lastTrainAcc = result.trainAcc;
  pos.lossSum = 0;
  pos.correct = 0;
  pos.samples = 0;
  pos.gradNormSum = pos.gradNormMax = 0;
  pos.gradNormSteps = pos.skippedInEpoch = pos.spikesInEpoch = 0;
  if (!result.stoppedEarly) {
    Position next = pos;
    next.epoch = pos.epoch + 1;
    next.batch = next.seen = 0;
    saveCheckpoint(next);
  }
  job_.barrier("after epoch " + std::to_string(pos.epoch + 1));
  timeline_.takeTotals();  // evaluation, checkpoint and this barrier are not the next epoch's steps
}

TrainResult Trainer::alreadyDone(const Position& pos, Clock::time_point start) {
  job_.log().info() << "the checkpoint is at the end of epoch " << pos.epoch << ": nothing left to train for --epochs "
                    << options_.epochs;
  TrainResult result;
  result.epochs = pos.epoch;
  result.steps = pos.step;
  result.skippedSteps = pos.skipped;
  result.skippedSpikes = pos.spikes;
  result.trainLoss = pos.lastTrainLoss;
  result.trainAcc = pos.lastTrainAcc;
  if (std::optional<Evaluation> e = evaluateTest()) {  // rank 0's; every rank takes part
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

std::optional<Evaluation> Trainer::evaluateTest() {
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
  if (!shared && (!test_ || rank != 0)) return std::nullopt;
  Timeline::Scope span(timeline_, SpanKind::kEvaluate);
  if (!shared) return evaluate(*test_);
  const int64_t n = test_->size(), chunk = evaluationChunk(model_, options_.evalBatchSize), chunks = chunkCount(n, chunk);
  const int64_t first = chunks * rank / ranks, last = chunks * (rank + 1) / ranks;
  std::vector<double> sums(2 * static_cast<size_t>(chunks), 0.0), pieces(kPiecesPerSum * sums.size(), 0.0);
  evaluateChunks(*test_, chunk, first, last, sums);
  // Job::reduce may go through float32 (ReplicaStrategy): the sums cross it as whole numbers.
  const size_t mine = 2 * static_cast<size_t>(first), count = 2 * static_cast<size_t>(last - first);
  splitSums(std::span<const double>(sums).subspan(mine, count),
            std::span<double>(pieces).subspan(kPiecesPerSum * mine, kPiecesPerSum * count));
  job_.reduce(pieces, Reduce::kSum);  // each chunk's from the one rank that has it, 0 from the others
  if (rank != 0) return std::nullopt;
  joinSums(pieces, sums);
  return evaluationOf(sums, n, loss_.positions());
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
