// Trainer's checkpoints (train/trainer.h): the loop's position beside the job's state.
#include "train/trainer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "train/checkpoint/checkpointer.h"
#include "train/observe/timeline.h"
#include "train/settings.h"

namespace cohort::train {

namespace {

std::string hexDouble(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

}  // namespace

// The loop's position, beside the job's state (train/checkpoint/checkpointer.h); the loss sum as a hex float
// so it round-trips exactly.
void Trainer::saveCheckpoint(const Position& pos) {
  if (options_.checkpointPath.empty()) return;
  Timeline::Scope span(timeline_, SpanKind::kCheckpoint);
  nn::Metadata metadata = {
                                         {"epoch", std::to_string(pos.epoch)},
                                         {"batch", std::to_string(pos.batch)},
                                         {"samples_seen", std::to_string(pos.seen)},
                                         {"step", std::to_string(pos.step)},
                                         {"rng_seed", std::to_string(rng_.seed())},
                                         {"rng_counter", std::to_string(rng_.counter())},
                                         {"loader_seed", std::to_string(loader_.options().seed)},
                                         {"batch_size", std::to_string(loader_.options().batchSize)},
                                         {"accumulate_steps", std::to_string(options_.accumulateSteps)},
                                         {"task", classification_ ? "classification" : "regression"},
                                         {"epoch_loss_sum", hexDouble(pos.lossSum)},
                                         {"epoch_correct", std::to_string(pos.correct)},
                                         {"epoch_samples", std::to_string(pos.samples)},
                                         {"last_train_loss", hexDouble(pos.lastTrainLoss)},
                                         {"last_train_acc", hexDouble(pos.lastTrainAcc)},
                                         {"epoch_grad_norm_sum", hexDouble(pos.gradNormSum)},
                                         {"epoch_grad_norm_max", hexDouble(pos.gradNormMax)},
                                         {"epoch_grad_norm_steps", std::to_string(pos.gradNormSteps)},
                                         {"epoch_skipped_steps", std::to_string(pos.skippedInEpoch)},
                                         {"skipped_steps", std::to_string(pos.skipped)},
                                         {"epoch_skipped_spikes", std::to_string(pos.spikesInEpoch)},
                                         {"skipped_spikes", std::to_string(pos.spikes)},
                                     };
  // What a resume checks against (checkResumedData, noteChangedSettings).
  metadata.insert(trainData_.begin(), trainData_.end());
  for (const auto& [key, value] : runSettings()) metadata[key] = value;
  if (!options_.tokenizerDigest.empty()) metadata["tokenizer_digest"] = options_.tokenizerDigest;
  job_.save(options_.checkpointPath, metadata, {.async = options_.asyncCheckpoints});
  checkpointHeld_ = true;
}

void Trainer::settleCheckpoint(bool wait) {
  if (!job_.checkpointInFlight()) return;
  Timeline::Scope span(timeline_, SpanKind::kCheckpoint);
  const std::optional<CheckpointCommit> c = job_.settleCheckpoint({.wait = wait});
  if (!c || job_.world().rank != 0) return;
  char figures[160];
  std::snprintf(figures, sizeof figures, "training waited %.1f ms to stage %.1f MiB per rank; written in %.1f ms",
                c->stagedSeconds * 1e3, static_cast<double>(c->stagingBytes) / (1 << 20), c->writtenSeconds * 1e3);
  job_.log().info() << "checkpoint of step " << c->step << " committed to " << c->path << " (generation "
                    << c->generation << ", " << c->shardFiles << " shard files): " << figures;
  for (const std::string& line : c->cleanupErrors) job_.log().warn() << line;
}

bool Trainer::loadCheckpoint(Position& pos) {
  const std::string& path = options_.checkpointPath;
  nn::Metadata mustMatch = {{"batch_size", std::to_string(loader_.options().batchSize)},
                             {"loader_seed", std::to_string(loader_.options().seed)}};
  // Checkpoints from before accumulation was recorded resume with one micro-batch per step.
  if (options_.accumulateSteps != 1) mustMatch["accumulate_steps"] = std::to_string(options_.accumulateSteps);
  std::optional<nn::Metadata> meta = job_.load(path, mustMatch);
  if (!meta) {
    job_.log().info() << "no checkpoint at " << path << " yet: starting from scratch";
    return false;
  }
  checkpointHeld_ = true;
  const nn::Metadata& m = *meta;
  newData_ = resumesOnNewData(m);
  loadPosition(m, pos);
  noteChangedSettings(m);
  pos.step = metadataCount(m, "step", path);
  pos.correct = metadataCount(m, "epoch_correct", path);
  pos.samples = metadataCount(m, "epoch_samples", path);
  pos.lossSum = std::strtod(metadataText(m, "epoch_loss_sum", path).c_str(), nullptr);
  pos.lastTrainLoss = std::strtod(metadataText(m, "last_train_loss", path).c_str(), nullptr);
  pos.lastTrainAcc = std::strtod(metadataText(m, "last_train_acc", path).c_str(), nullptr);
  // Rank 0's counter; each rank keeps its own stream (the seed it was made with), as in the
  // uninterrupted run, where the ranks draw alike.
  rng_ = runtime::Rng(rng_.seed(), std::stoull(metadataText(m, "rng_counter", path)));
  // Checkpoints from before the gradient's figures were recorded start them afresh.
  if (m.count("skipped_steps")) {
    pos.gradNormSum = std::strtod(metadataText(m, "epoch_grad_norm_sum", path).c_str(), nullptr);
    pos.gradNormMax = std::strtod(metadataText(m, "epoch_grad_norm_max", path).c_str(), nullptr);
    pos.gradNormSteps = metadataCount(m, "epoch_grad_norm_steps", path);
    pos.skippedInEpoch = metadataCount(m, "epoch_skipped_steps", path);
    pos.skipped = metadataCount(m, "skipped_steps", path);
  }
  // Checkpoints from before the spike rule count none.
  if (m.count("skipped_spikes")) {
    pos.spikesInEpoch = metadataCount(m, "epoch_skipped_spikes", path);
    pos.spikes = metadataCount(m, "skipped_spikes", path);
  }
  if (newData_) {  // the epoch afresh: its running figures too
    pos.lossSum = 0;
    pos.correct = pos.samples = 0;
    pos.gradNormSum = pos.gradNormMax = 0;
    pos.gradNormSteps = pos.skippedInEpoch = pos.spikesInEpoch = 0;
  }
  return true;
}

void Trainer::loadPosition(const nn::Metadata& m, Position& pos) {
  const std::string& path = options_.checkpointPath;
  pos.epoch = metadataCount(m, "epoch", path);
  pos.batch = metadataCount(m, "batch", path);
  const int64_t wasRanks = metadataCount(m, "world_size", path), ranks = job_.world().worldSize;
  // Checkpoints from before samples were counted stopped after whole steps of wasRanks batches.
  pos.seen = m.count("samples_seen") ? metadataCount(m, "samples_seen", path)
                                     : pos.batch * wasRanks * loader_.options().batchSize;
  if (newData_) pos.batch = pos.seen = 0;  // the epoch's order on the new data, from its start
  const int64_t n = loader_.dataset().size();
  if (pos.seen > n) {
    COHORT_THROW(IoError) << path << ": checkpoint has seen " << pos.seen << " samples of an epoch of " << n;
  }
  if (wasRanks == ranks) return;
  if (options_.stepsPerEpoch > 0 && !newData_) {
    COHORT_THROW(InvalidArgument) << path << ": checkpoint was written by " << wasRanks << " ranks and this job has "
                                  << ranks << ": an epoch of " << options_.stepsPerEpoch
                                  << " steps (--steps-per-epoch) "
                                  << "ends at a batch that depends on the number of ranks, so it cannot continue "
                                  << "(resume with " << wasRanks << " ranks)";
  }
  if (schedule_ && schedule_->options().kind == nn::LrScheduleKind::kCosine && options_.lrSchedule->totalSteps == 0) {
    COHORT_THROW(InvalidArgument) << path << ": checkpoint was written by " << wasRanks << " ranks and this job has "
                                  << ranks << ": the cosine schedule spans the run's optimizer steps, whose number "
                                  << "depends on the number of ranks, so it cannot continue (resume with " << wasRanks
                                  << " ranks, or start afresh)";
  }
  if (job_.world().rank == 0 && !newData_) {
    job_.log().info() << "elastic resume: the checkpoint's " << wasRanks << " ranks had seen " << pos.seen << " of the "
                      << n << " samples of epoch " << pos.epoch + 1 << "; the rest is split over " << ranks
                      << (ranks == 1 ? " rank" : " ranks");
  }
}

namespace {

// "tokens:a.bin/train (1000 samples, digest 3f2a…)"
std::string describeData(const std::string& name, const std::string& samples, const std::string& digest) {
  return name + " (" + samples + " samples, digest " + digest.substr(0, 12) + ")";
}

}  // namespace

bool Trainer::resumesOnNewData(const nn::Metadata& m) const {
  const std::string& path = options_.checkpointPath;
  const bool leads = job_.world().rank == 0;
  if (!m.count("train_data_digest")) {
    if (leads) {
      job_.log().warn() << path << " does not record the data it was trained on (written by an older Cohort): "
                        << "cannot check that " << trainData_.at("train_data") << " is that data";
    }
    return false;
  }
  const std::string was = describeData(metadataText(m, "train_data", path), metadataText(m, "train_samples", path),
                                       metadataText(m, "train_data_digest", path));
  const std::string now = describeData(trainData_.at("train_data"), trainData_.at("train_samples"),
                                       trainData_.at("train_data_digest"));
  // The samples decide (their count and digest); a name alone may change when the files move.
  if (m.at("train_samples") == trainData_.at("train_samples") &&
      m.at("train_data_digest") == trainData_.at("train_data_digest")) {
    if (leads && m.at("train_data") != trainData_.at("train_data")) {
      job_.log().info() << "resuming on " << now << ": the checkpoint's run read the same samples as "
                        << m.at("train_data");
    }
    return false;
  }
  if (!options_.resumeOnNewData) {
    COHORT_THROW(InvalidArgument) << path << ": the checkpoint was trained on " << was << ", and this run's data is "
                                  << now << ": resuming would continue its epoch on other data. Give the checkpoint's "
                                  << "data, or --resume-on-new-data to keep the weights and optimizer state and "
                                  << "start a new epoch order on this data";
  }
  if (leads) {
    job_.log().info() << "resuming on new data (--resume-on-new-data): the checkpoint was trained on " << was
                      << "; weights, optimizer state and step count kept, and its epoch starts afresh on " << now
                      << " (a new order, from its first sample)";
  }
  return true;
}

namespace {

// The optimizer's parameter groups, as a run's setting: the elements of each (decay, lr scale), in
// the order they first appear ("none" without groups).
std::string describeGroups(const nn::OptimizerOptions& o) {
  if (o.groups.empty()) return "none";
  std::vector<std::pair<std::pair<float, float>, size_t>> kinds;
  for (const nn::ParamGroup& g : o.groups) {
    const std::pair<float, float> kind{g.weightDecay, g.lrScale};
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == kind; });
    if (it == kinds.end()) it = kinds.insert(kinds.end(), {kind, 0});
    it->second += g.end - g.begin;
  }
  std::string text;
  for (const auto& [kind, elements] : kinds) {
    text += (text.empty() ? "" : "; ") + std::to_string(elements) + " elements at decay " + settingValue(kind.first) +
            ", lr x" + settingValue(kind.second);
  }
  return text;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> Trainer::runSettings() const {
  const nn::OptimizerOptions& o = job_.optimizer().options();
  // With a schedule the optimizer's rate is the step's: the schedule's base is the run's.
  const std::string lr = schedule_ ? settingValue(schedule_->options().baseLr) : settingValue(o.lr);
  return {{"lr", lr},
          {"weight_decay", settingValue(o.weightDecay)},
          {"momentum", settingValue(o.momentum) + (o.nesterov ? " (nesterov)" : "")},
          {"betas", settingValue(o.beta1) + "," + settingValue(o.beta2)},
          {"lr_schedule", schedule_ ? schedule_->describe() : "none"},
          {"clip_grad_norm", settingValue(options_.clipGradNorm)},
          {"weight_decay_groups", describeGroups(o)}};
}

void Trainer::noteChangedSettings(const nn::Metadata& m) const {
  if (job_.world().rank != 0) return;
  for (const auto& [key, value] : runSettings()) {
    auto was = m.find(key);
    if (was == m.end() || was->second == value) continue;  // older checkpoints record none
    std::string name = key;
    std::replace(name.begin(), name.end(), '_', ' ');
    job_.log().info() << "resuming with " << name << " " << value << " (the checkpoint's run had " << was->second << ")";
  }
  // Another tokenizer's ids mean other text: the run goes on, but says so.
  auto tokenizer = m.find("tokenizer_digest");
  if (tokenizer != m.end() && !options_.tokenizerDigest.empty() && tokenizer->second != options_.tokenizerDigest) {
    job_.log().warn() << "resuming with another tokenizer (digest " << options_.tokenizerDigest
                      << "; the checkpoint's run had " << tokenizer->second
                      << "): the same ids now stand for other text";
  }
}

bool Trainer::nothingToTrain(const Position& pos) const {
  if (pos.epoch >= options_.epochs) {
    note() << "the checkpoint is at the end of epoch " << pos.epoch << ": nothing left to train for --epochs "
           << options_.epochs;
    return true;
  }
  if (options_.maxSteps > 0 && pos.step >= options_.maxSteps) {
    note() << "the checkpoint is at step " << pos.step << ", --max-steps " << options_.maxSteps << ": nothing to train";
    return true;
  }
  return false;
}

void Trainer::openSampleLog() {
  const std::string& dir = job_.options().testHooks.sampleLogDir;
  if (dir.empty()) return;
  const std::string file = dir + "/samples.rank" + std::to_string(job_.world().rank);
  sampleLog_.reset(std::fopen(file.c_str(), "a"));
  if (!sampleLog_) {
    COHORT_THROW(IoError) << "the sample log (a test hook): cannot append to " << file << ": " << std::strerror(errno);
  }
}

void Trainer::logSamples(int64_t epoch, int64_t batchIndex) {
  std::vector<int64_t> samples;
  loader_.batchSamples(batchIndex, samples);
  for (int64_t sample : samples) {
    std::fprintf(sampleLog_.get(), "%lld %lld\n", static_cast<long long>(epoch), static_cast<long long>(sample));
  }
  std::fflush(sampleLog_.get());
}

}  // namespace cohort::train
