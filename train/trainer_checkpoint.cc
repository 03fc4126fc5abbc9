// Trainer's checkpoints (train/trainer.h): the loop's position beside the job's state.
#include "train/trainer.h"

#include <cstdio>
#include <cstdlib>
#include <string>

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
                                         {"step", std::to_string(pos.step)},
                                         {"rng_seed", std::to_string(rng_.seed())},
                                         {"rng_counter", std::to_string(rng_.counter())},
                                         {"loader_seed", std::to_string(loader_.options().seed)},
                                         {"batch_size", std::to_string(loader_.options().batchSize)},
                                         {"accumulate_steps", std::to_string(options_.accumulateSteps)},
                                         {"task", options_.classification ? "classification" : "regression"},
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
                                     });
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
  const nn::Metadata& m = *meta;
  pos.epoch = metadataCount(m, "epoch", path);
  pos.batch = metadataCount(m, "batch", path);
  pos.step = metadataCount(m, "step", path);
  pos.correct = metadataCount(m, "epoch_correct", path);
  pos.samples = metadataCount(m, "epoch_samples", path);
  pos.lossSum = std::strtod(metadataText(m, "epoch_loss_sum", path).c_str(), nullptr);
  pos.lastTrainLoss = std::strtod(metadataText(m, "last_train_loss", path).c_str(), nullptr);
  pos.lastTrainAcc = std::strtod(metadataText(m, "last_train_acc", path).c_str(), nullptr);
  rng_ = runtime::Rng(std::stoull(metadataText(m, "rng_seed", path)), std::stoull(metadataText(m, "rng_counter", path)));
  // Checkpoints from before the gradient's figures were recorded start them afresh.
  if (m.count("skipped_steps")) {
    pos.gradNormSum = std::strtod(metadataText(m, "epoch_grad_norm_sum", path).c_str(), nullptr);
    pos.gradNormMax = std::strtod(metadataText(m, "epoch_grad_norm_max", path).c_str(), nullptr);
    pos.gradNormSteps = metadataCount(m, "epoch_grad_norm_steps", path);
    pos.skippedInEpoch = metadataCount(m, "epoch_skipped_steps", path);
    pos.skipped = metadataCount(m, "skipped_steps", path);
  }
  if (pos.batch > loader_.batchesPerEpoch()) {
    COHORT_THROW(IoError) << path << ": checkpoint batch " << pos.batch << " is beyond the epoch's "
                          << loader_.batchesPerEpoch() << " batches";
  }
  return true;
}

}  // namespace cohort::train
