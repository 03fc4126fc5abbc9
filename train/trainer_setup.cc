// The Trainer's construction (train/trainer.h): the options checked, the ranks' settings agreed,
// the data checked against the model and the loss before any step, rank 0's outputs prepared.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "runtime/digest.h"
#include "runtime/error.h"
#include "train/observe/metrics_sink.h"
#include "train/observe/progress.h"
#include "train/trainer.h"

namespace cohort::train {

using runtime::Shape;

namespace {

runtime::data::DataLoaderOptions loaderOptions(const Job& job, const TrainerOptions& o) {
  return job.dataSplit({.batchSize = o.batchSize, .seed = o.seed, .prefetch = o.prefetch, .augment = o.augment});
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
  const std::string hex =
      runtime::Digest().add(sampledDigest(test)).add(std::to_string(test.size()) + "/" + std::to_string(chunk)).hex();
  return std::stoull(hex.substr(0, 12), nullptr, 16);
}

// What the ranks of one Trainer must share (Job::agree); the prefetch depth, the evaluation batch
// and the metrics file may differ per rank.
Settings trainerSettings(const nn::Metadata& data, const runtime::data::Dataset& train, const TrainerOptions& o,
                         bool classification, const nn::LrSchedule* schedule) {
  // Ranks that differ in their data have each built their own (a part of it, or seeded by rank).
  const std::string fix =
      "Every rank must build the same full training set (the same files, seed and order); the "
      "Trainer gives each rank its shard of it, so do not split or seed the data by rank "
      "(docs/api.md, \"train::Trainer\"; for cohort train, docs/errors.md)";
  return {
      {"train_data", data.at("train_data"), fix},
      {"train_samples", data.at("train_samples"), fix},
      {"sample_shape", train.sampleShape().str(), fix},
      {"train_data_digest", data.at("train_data_digest"), fix},
      {"epochs", std::to_string(o.epochs)},
      {"batch_size", std::to_string(o.batchSize)},
      {"data_seed", std::to_string(o.seed)},
      {"augment", "crop padding " + std::to_string(o.augment.cropPadding) + (o.augment.horizontalFlip ? ", flip" : "")},
      {"classification", classification ? "yes" : "no"},
      {"checkpoint", o.checkpointPath},
      {"checkpoint_every", std::to_string(o.checkpointEvery)},
      {"resume", o.resume ? (o.resumeOnNewData ? "yes, on new data" : "yes") : "no"},
      {"max_steps", std::to_string(o.maxSteps)},
      {"steps_per_epoch", std::to_string(o.stepsPerEpoch)},
      {"eval_every", std::to_string(o.evalEverySteps) + ", " + std::to_string(o.evalBatches) + " batches"},
      {"sample_every", std::to_string(o.sampleEverySteps)},
      {"accumulate_steps", std::to_string(o.accumulateSteps)},
      {"lr_schedule", schedule ? schedule->describe() : "none"},
      {"clip_grad_norm", std::to_string(o.clipGradNorm)},
      {"skip_nonfinite", std::to_string(o.skipNonFinite)},
      {"skip_spikes", std::to_string(o.skipSpikes) + ", " + std::to_string(o.maxSpikesInARow) + " in a row"}};
}

// The schedule with the run's defaults filled in (see TrainerOptions::lrSchedule).
// `runSteps`: the run's steps (over the epochs, whatever maxSteps says: a run stopped by maxSteps and
// resumed follows the same schedule as one that never stopped; maxSteps where the epochs follow it).
std::optional<nn::LrSchedule> makeSchedule(const TrainerOptions& o, const nn::Optimizer& optimizer, int64_t runSteps) {
  if (!o.lrSchedule) return std::nullopt;
  nn::LrScheduleOptions s = *o.lrSchedule;
  if (s.baseLr == 0) s.baseLr = optimizer.options().lr;
  if (s.totalSteps == 0) s.totalSteps = runSteps;
  return nn::LrSchedule(s);
}

// TrainerOptions::classification where unset: from the built-in losses, else from the data.
bool inferClassification(const TrainerOptions& o, const nn::Loss& loss, const runtime::data::Dataset& train) {
  if (o.classification) return *o.classification;
  if (dynamic_cast<const nn::SoftmaxCrossEntropy*>(&loss)) return true;
  if (dynamic_cast<const nn::MeanSquaredError*>(&loss)) return false;
  return train.numClasses() > 0;
}

const Job& placedJob(const Job& job) {
  if (!job.placed())
    COHORT_THROW(InvalidArgument) << "a Trainer needs a job whose model is placed: call Job::place() first";
  return job;
}

}  // namespace

Trainer::Trainer(Job& job, nn::Loss& loss, const runtime::data::Dataset& train, const runtime::data::Dataset* test,
                 TrainerOptions options, TrainerCallbacks callbacks)
    : job_(job),
      model_(placedJob(job).model()),
      loss_(loss),
      loader_(train, loaderOptions(job, options)),
      test_(test),
      testKey_(test ? testKey(*test, evaluationChunk(model_, options.evalBatchSize)) : 0),
      options_(std::move(options)),
      trainData_({{"train_data", train.name()},
                  {"train_samples", std::to_string(train.size())},
                  {"train_data_digest", sampledDigest(train)}}),
      callbacks_(std::move(callbacks)),
      rng_(runtime::mix(options_.seed + static_cast<uint64_t>(job.world().rank), 0x64726f70ull /* "drop" */)),
      timeline_(job.timeline()) {
  openSampleLog();
  loss_.setGradType(job_.options().precision);  // bf16 passes: the gradient the model's bf16 head reads
  loss_.setGradInPlace(!model_.net->backwardReadsOutput());  // a GPT: its logits take their gradient
  checkOptions();
  classification_ = inferClassification(options_, loss_, train);
  schedule_ = makeSchedule(options_, job_.optimizer(),
                           options_.epochs == 0 ? options_.maxSteps : options_.epochs * stepsPerEpoch());
  // The settings first, so that ranks given different data fail alike, naming the difference.
  job_.agree(trainerSettings(trainData_, train, options_, classification_, lrSchedule()));
  // Epochs until maxSteps: a Hogwild worker's own (its share of an epoch may be a batch shorter).
  if (options_.epochs == 0) options_.epochs = (options_.maxSteps + stepsPerEpoch() - 1) / stepsPerEpoch();
  checkData(train, "training");
  if (test_) checkData(*test_, "test");
  prepareOutputs();
  prepareMfu();
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
  // Every output file the same way (nn::checkOutputFile): its directory must exist (the library makes none;
  // cohort train makes them before, runtime::createParentDirectories).
  if (!options_.tracePath.empty()) {
    prepareOnRankZero([&] { nn::checkOutputFile(options_.tracePath, "the trace"); },
                      "the trace to " + options_.tracePath);
  }
  if (!options_.metricsPath.empty() || !options_.tensorboardDir.empty()) {
    prepareOnRankZero(
        [&] {
          if (!options_.metricsPath.empty()) nn::checkOutputFile(options_.metricsPath, "metrics");
          metrics_ = std::make_unique<MetricsSink>(options_.metricsPath, options_.tensorboardDir);
          if (const std::optional<uint64_t> cut = metrics_->tornLineCutAt()) {
            job_.log().warn() << options_.metricsPath << ": its last line was torn (a run stopped mid-write): cut off at "
                              << "byte " << *cut;
          }
        },
        "metrics to " + (options_.tensorboardDir.empty() ? options_.metricsPath : options_.tensorboardDir));
  }
}

void Trainer::checkOptions() const {
  if (!(options_.progressEverySeconds >= 0) || !std::isfinite(options_.progressEverySeconds)) {
    COHORT_THROW(InvalidArgument) << "progressEverySeconds must be a finite number >= 0 (0: no progress), got "
                                  << options_.progressEverySeconds;
  }
  if (!job_.lockstep() && options_.checkpointEvery > 0) {
    COHORT_THROW(InvalidArgument) << "checkpointEvery needs ranks that step together: Hogwild workers meet "
                                     "(and checkpoint) only at the end of each epoch (or at maxSteps)";
  }
  checkSampleOptions();
  if (options_.asyncCheckpoints && (job_.options().zero == 0 || options_.checkpointPath.empty())) {
    COHORT_THROW(InvalidArgument) << "asyncCheckpoints needs a checkpoint path and a sharded job (zero >= 1): the shard "
                                     "files are what is written in the background";
  }
  if (options_.epochs < 0 || (options_.epochs == 0 && options_.maxSteps <= 0)) {
    COHORT_THROW(InvalidArgument) << "epochs must be positive (or 0 with maxSteps: as many as it takes), got "
                                  << options_.epochs;
  }
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
  // A loss that counts no correct predictions gives an accuracy of 0 (a user's own loss may count
  // them whatever its data: it is taken at its word).
  if (options_.classification.value_or(false) && dynamic_cast<const nn::MeanSquaredError*>(&loss_)) {
    COHORT_THROW(InvalidArgument)
        << "TrainerOptions::classification is true, but the loss " << loss_.name()
        << " counts no correct predictions, so the accuracy would read 0: leave classification "
           "unset (inferred from the loss and the data) or set it false";
  }
}

// The data against the model, with what the first step would otherwise find: the sample's element
// count against ModelInfo::sampleShape (a [1, 28, 28] model takes flat rows of 784), a batch of it
// through the network's outputShape, and the output against the built-in losses' targets.
void Trainer::checkData(const runtime::data::Dataset& data, const char* role) const {
  const Shape sample = data.sampleShape();
  const std::string set = std::string("the ") + role + " set " + data.name();
  auto fix = [&](const std::string& wanted) {
    return "; build the model for samples of shape " + sample.str() + ", or give " + set + " samples of " + wanted +
           " (datasetFromArrays' sampleShape)";
  };
  if (model_.sampleShape.rank() > 0 && model_.sampleShape.numel() != sample.numel()) {
    COHORT_THROW(InvalidArgument) << "model " << model_.name << " takes samples of shape " << model_.sampleShape.str()
                                  << " (ModelInfo::sampleShape) but " << set << " has samples of shape " << sample.str()
                                  << fix("shape " + model_.sampleShape.str());
  }
  Shape batch{std::clamp<int64_t>(options_.batchSize, 1, std::max<int64_t>(data.size(), 1))};
  for (int i = 0; i < sample.rank(); ++i) batch.push(sample[i]);
  Shape out;
  try {
    out = model_.net->outputShape(batch);
  } catch (const InvalidArgument& e) {
    COHORT_THROW(InvalidArgument) << "model " << model_.name << " cannot take the samples of shape " << sample.str()
                                  << " of " << set << " (a batch of " << batch.str() << "): " << e.what()
                                  << fix("the shape the model takes");
  }
  const int64_t classes = data.numClasses(), targets = data.targetShape().numel();
  if (dynamic_cast<const nn::SoftmaxCrossEntropy*>(&loss_) && classes > 0 &&
      (out.rank() < 2 || out[out.rank() - 1] < classes)) {
    COHORT_THROW(InvalidArgument) << "model " << model_.name << " gives outputs of shape " << out.str()
                                  << " for a batch of " << batch.str() << ", but " << set << " has " << classes
                                  << " classes: its last layer "
                                  << "needs " << classes << " outputs";
  }
  if (dynamic_cast<const nn::MeanSquaredError*>(&loss_) && out.numel() != batch[0] * targets) {
    COHORT_THROW(InvalidArgument) << "model " << model_.name << " gives outputs of shape " << out.str()
                                  << " for a batch of " << batch.str() << ", but " << set << " has " << targets
                                  << " target value(s) per "
                                  << "sample, and " << loss_.name() << " needs as many outputs";
  }
}

}  // namespace cohort::train
