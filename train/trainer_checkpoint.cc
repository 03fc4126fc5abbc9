// Trainer's checkpoints (train/trainer.h): the loop's position beside the job's state.
#include "train/trainer.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "train/checkpointer.h"
#include "train/timeline.h"

namespace cohort::train {

namespace {

std::string hexDouble(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

}  // namespace

// The loop's position, beside the job's state (train/checkpointer.h); the loss sum as a hex float
// so it round-trips exactly.
void Trainer::saveCheckpoint(const Position& pos) {
  if (options_.checkpointPath.empty()) return;
  Timeline::Scope span(timeline_, SpanKind::kCheckpoint);
  job_.save(options_.checkpointPath, {
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
                                     });
  checkpointHeld_ = true;
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
  loadPosition(m, pos);
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
  const int64_t n = loader_.dataset().size();
  if (pos.seen > n) {
    COHORT_THROW(IoError) << path << ": checkpoint has seen " << pos.seen << " samples of an epoch of " << n;
  }
  if (wasRanks == ranks) return;
  if (schedule_ && schedule_->options().kind == nn::LrScheduleKind::kCosine && options_.lrSchedule->totalSteps == 0) {
    COHORT_THROW(InvalidArgument) << path << ": checkpoint was written by " << wasRanks << " ranks and this job has "
                                  << ranks << ": the cosine schedule spans the run's optimizer steps, whose number "
                                  << "depends on the number of ranks, so it cannot continue (resume with " << wasRanks
                                  << " ranks, or start afresh)";
  }
  if (job_.world().rank == 0) {
    job_.log().info() << "elastic resume: the checkpoint's " << wasRanks << " ranks had seen " << pos.seen << " of the "
                      << n << " samples of epoch " << pos.epoch + 1 << "; the rest is split over " << ranks
                      << (ranks == 1 ? " rank" : " ranks");
  }
}

void Trainer::openSampleLog() {
  const char* dir = std::getenv("COHORT_TEST_SAMPLE_LOG");
  if (!dir) return;
  const std::string file = std::string(dir) + "/samples.rank" + std::to_string(job_.world().rank);
  sampleLog_.reset(std::fopen(file.c_str(), "a"));
  if (!sampleLog_) {
    COHORT_THROW(IoError) << "COHORT_TEST_SAMPLE_LOG: cannot append to " << file << ": " << std::strerror(errno);
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
