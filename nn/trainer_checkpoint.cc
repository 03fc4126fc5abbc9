// Trainer state <-> checkpoint files. Kept apart from the loop in trainer.cc.
//
// Tensors: every parameter under its own name ("fc0.weight"), then every non-trainable buffer of the
// model under its own name ("bn0.running_mean"; models without any write none, so their checkpoints
// are unchanged), then every optimizer state buffer as one flat tensor "optimizer.<name>".
// Metadata: what must match to resume (model spec, optimizer, parameter count) and where the run
// stands (epoch, batch, step, Rng counter, running sums; the loss sum as a hex float so it
// round-trips exactly).
#include <cinttypes>
#include <cstdio>
#include <sys/stat.h>

#include "nn/checkpoint.h"
#include "nn/trainer.h"
#include "runtime/error.h"

namespace cohort::nn {
namespace {

std::string hexDouble(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

const std::string& need(const Metadata& m, const std::string& key, const std::string& path) {
  auto it = m.find(key);
  if (it == m.end()) COHORT_THROW(IoError) << path << ": checkpoint metadata lacks '" << key << "'";
  return it->second;
}

int64_t needInt(const Metadata& m, const std::string& key, const std::string& path) {
  const std::string& text = need(m, key, path);
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 0) {
    COHORT_THROW(IoError) << path << ": checkpoint metadata '" << key << "' = '" << text << "' is not a count";
  }
  return v;
}

void expectSame(const Metadata& m, const std::string& key, const std::string& now, const std::string& path) {
  const std::string& was = need(m, key, path);
  if (was != now) {
    COHORT_THROW(InvalidArgument) << path << ": checkpoint was written with " << key << " '" << was
                                  << "' but this run uses '" << now << "'";
  }
}

void loadTensor(const Checkpoint& ckpt, const std::string& path, const std::string& name, const Tensor& into) {
  const Tensor* t = ckpt.find(name);
  if (!t) COHORT_THROW(IoError) << path << ": checkpoint has no tensor '" << name << "'";
  if (t->numel() != into.numel()) {
    COHORT_THROW(IoError) << path << ": tensor '" << name << "' has shape " << t->shape().str() << ", the model needs "
                          << into.shape().str();
  }
  into.copyFrom(*t);
}

void loadParamsFromCheckpoint(const Checkpoint& ckpt, const std::string& path, const ParamBuffer& params) {
  for (size_t i = 0; i < params.entries().size(); ++i) loadTensor(ckpt, path, params.entries()[i].name, params.value(i));
}

// Buffers are private to each process (never in a shared segment), so every rank loads its own.
void loadBuffersFromCheckpoint(const Checkpoint& ckpt, const std::string& path, const ParamBuffer& params) {
  for (size_t i = 0; i < params.bufferEntries().size(); ++i) {
    loadTensor(ckpt, path, params.bufferEntries()[i].name, params.buffer(i));
  }
}

}  // namespace

// Parameters only: the buffers are loaded by each rank's Trainer::loadCheckpoint.
void loadParamsFromCheckpoint(const std::string& path, const ParamBuffer& params) {
  loadParamsFromCheckpoint(readCheckpoint(path), path, params);
}

void Trainer::saveCheckpoint(const Position& pos) {
  if (options_.checkpointPath.empty() || world_.rank != 0) return;
  std::vector<NamedTensor> tensors;
  for (size_t i = 0; i < model_.params.entries().size(); ++i) {
    tensors.push_back({model_.params.entries()[i].name, model_.params.value(i)});
  }
  for (size_t i = 0; i < model_.params.bufferEntries().size(); ++i) {
    tensors.push_back({model_.params.bufferEntries()[i].name, model_.params.buffer(i)});
  }
  const bool perRankState = sync_ && !sync_->replicated();
  if (perRankState) {
    for (NamedTensor& t : sync_->gatheredOptimizerState(optimizer_)) tensors.push_back(std::move(t));
  } else {
    for (const auto& s : optimizer_.state()) tensors.push_back({"optimizer." + s.name, s.tensor});
  }
  Metadata meta = {
      {"model", model_.spec},
      {"optimizer", optimizer_.name()},
      {"param_count", std::to_string(model_.params.numel())},
      {"world_size", std::to_string(world_.worldSize)},
      {"epoch", std::to_string(pos.epoch)},
      {"batch", std::to_string(pos.batch)},
      {"step", std::to_string(pos.step)},
      {"optimizer_steps", std::to_string(optimizer_.steps())},
      {"rng_seed", std::to_string(rng_.seed())},
      {"rng_counter", std::to_string(rng_.counter())},
      {"loader_seed", std::to_string(train_.options().seed)},
      {"batch_size", std::to_string(train_.options().batchSize)},
      {"epoch_loss_sum", hexDouble(pos.lossSum)},
      {"epoch_correct", std::to_string(pos.correct)},
      {"epoch_samples", std::to_string(pos.samples)},
      {"last_train_loss", hexDouble(pos.lastTrainLoss)},
      {"last_train_acc", hexDouble(pos.lastTrainAcc)},
  };
  if (perRankState) {
    std::vector<int64_t> steps = sync_->optimizerSteps();
    for (size_t r = 0; r < steps.size(); ++r) meta["optimizer_steps.rank" + std::to_string(r)] = std::to_string(steps[r]);
  }
  writeCheckpoint(options_.checkpointPath, tensors, meta);
}

bool Trainer::loadCheckpoint(Position& pos) {
  const std::string& path = options_.checkpointPath;
  struct stat st;
  if (path.empty() || ::stat(path.c_str(), &st) != 0) {
    log_.info() << "no checkpoint at " << (path.empty() ? "(none given)" : path) << " yet: starting from scratch";
    return false;
  }
  Checkpoint ckpt = readCheckpoint(path);
  const Metadata& m = ckpt.metadata;
  expectSame(m, "model", model_.spec, path);
  expectSame(m, "optimizer", optimizer_.name(), path);
  expectSame(m, "batch_size", std::to_string(train_.options().batchSize), path);
  expectSame(m, "loader_seed", std::to_string(train_.options().seed), path);
  expectSame(m, "world_size", std::to_string(world_.worldSize), path);
  if (!options_.paramsShared) loadParamsFromCheckpoint(ckpt, path, model_.params);
  loadBuffersFromCheckpoint(ckpt, path, model_.params);
  const bool perRankState = sync_ && !sync_->replicated();
  const std::string prefix = perRankState ? "optimizer.rank" + std::to_string(world_.rank) + "." : "optimizer.";
  if (!options_.optimizerStateShared || world_.localRank == 0) {
    for (const auto& s : optimizer_.state()) loadTensor(ckpt, path, prefix + s.name, s.tensor);
  }
  if (perRankState) {
    optimizer_.setSteps(needInt(m, "optimizer_steps.rank" + std::to_string(world_.rank), path));
  } else {
    optimizer_.setSteps(needInt(m, "optimizer_steps", path));
  }
  pos.epoch = needInt(m, "epoch", path);
  pos.batch = needInt(m, "batch", path);
  pos.step = needInt(m, "step", path);
  pos.correct = needInt(m, "epoch_correct", path);
  pos.samples = needInt(m, "epoch_samples", path);
  pos.lossSum = std::strtod(need(m, "epoch_loss_sum", path).c_str(), nullptr);
  pos.lastTrainLoss = std::strtod(need(m, "last_train_loss", path).c_str(), nullptr);
  pos.lastTrainAcc = std::strtod(need(m, "last_train_acc", path).c_str(), nullptr);
  rng_ = runtime::Rng(std::stoull(need(m, "rng_seed", path)), std::stoull(need(m, "rng_counter", path)));
  if (pos.batch > train_.batchesPerEpoch()) {
    COHORT_THROW(IoError) << path << ": checkpoint batch " << pos.batch << " is beyond the epoch's "
                          << train_.batchesPerEpoch() << " batches";
  }
  return true;
}

}  // namespace cohort::nn
