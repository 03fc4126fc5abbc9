#include "nn/trainer.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#include "runtime/data/device_loader.h"
#endif

namespace cohort::nn {

double Trainer::secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

Trainer::Trainer(Model& model, Optimizer& optimizer, Loss& loss, runtime::data::DataLoader& train,
                 const runtime::data::Dataset* test, const runtime::WorldInfo& world, const runtime::Logger& log,
                 TrainerOptions options, JobSync* sync)
    : model_(model), optimizer_(optimizer), loss_(loss), train_(train), test_(test), world_(world), log_(log),
      options_(std::move(options)), sync_(sync),
      rng_(runtime::mix(options_.seed + static_cast<uint64_t>(world.rank), 0x64726f70ull /* "drop" */)) {}

TrainResult Trainer::run() {
  const auto start = Clock::now();
  Position pos;
  if (options_.resume && loadCheckpoint(pos)) {
    log_.info() << "resumed from " << options_.checkpointPath << " at epoch " << pos.epoch + 1 << " batch "
                << pos.batch << " (step " << pos.step << ")";
  }
  TrainResult result;
  if (pos.epoch >= options_.epochs) return alreadyDone(pos, start);
  Pass pass;
  pass.rng = &rng_;
  pass.needInputGrad = false;
  pass.gradReady = sync_ ? sync_->gradReady() : nullptr;
  pass.gpu = options_.gpu;
  // Batches come from the host loader, or on a GPU through the device loader that copies them ahead.
  std::function<void(int64_t, int64_t)> startEpoch = [&](int64_t e, int64_t b) { train_.startEpoch(e, b); };
  std::function<bool(runtime::data::Batch&)> nextBatch = [&](runtime::data::Batch& b) { return train_.next(b); };
#ifdef COHORT_HAVE_CUDA
  std::unique_ptr<runtime::data::DeviceLoader> deviceBatches;
  if (options_.gpu) {
    deviceBatches = std::make_unique<runtime::data::DeviceLoader>(train_, *options_.gpu);
    startEpoch = [&](int64_t e, int64_t b) { deviceBatches->startEpoch(e, b); };
    nextBatch = [&](runtime::data::Batch& b) { return deviceBatches->next(b); };
  }
#endif
  if (sync_) sync_->barrier("start");
  for (; pos.epoch < options_.epochs; ++pos.epoch, pos.batch = 0) {
    const auto epochStart = Clock::now();
    const int64_t samplesBefore = pos.samples;
    startEpoch(pos.epoch, pos.batch);
    for (runtime::data::Batch batch; nextBatch(batch);) {
      const Tensor& out = model_.net->forward(batch.inputs, pass);
#ifdef COHORT_HAVE_CUDA
      if (options_.gpu) {
        loss_.forwardGpu(out, batch.targets, *options_.gpu);
      } else
#endif
      {
        pos.lossSum += static_cast<double>(loss_.forward(out, batch.targets)) * static_cast<double>(batch.size);
        pos.correct += loss_.correct();
      }
      pos.samples += batch.size;
      model_.net->backward(loss_.backward(), pass);
      if (sync_) {
        sync_->synchronizeGradients();
        sync_->optimizerStep(optimizer_, model_.params.values(), model_.params.grads());
      } else {
        optimizer_.step(model_.params.values(), model_.params.grads());
      }
      ++pos.step;
      pos.batch = batch.index + 1;
      const bool midEpoch = pos.batch < train_.batchesPerEpoch();
      if (stopRequested(pos.step) && midEpoch) {
        log_.info() << "stop requested (SIGUSR1): checkpointing at step " << pos.step << " and stopping";
        collectGpuSums(pos);
        saveCheckpoint(pos);
        result.stoppedEarly = result.stoppedBySignal = true;
        break;
      }
      if (options_.maxSteps > 0 && pos.step >= options_.maxSteps && midEpoch) {
        collectGpuSums(pos);
        saveCheckpoint(pos);
        result.stoppedEarly = true;
        break;
      }
      if (options_.checkpointEvery > 0 && pos.step % options_.checkpointEvery == 0 && midEpoch) {
        collectGpuSums(pos);
        saveCheckpoint(pos);
      }
    }
    collectGpuSums(pos);  // also waits for the epoch's last step, so the time below includes it
    finishEpoch(pos, result, secondsSince(epochStart), pos.samples - samplesBefore);
    if (result.stoppedBySignal) break;
    if (result.stoppedEarly || (options_.maxSteps > 0 && pos.step >= options_.maxSteps && pos.epoch + 1 < options_.epochs)) {
      result.stoppedEarly = true;
      log_.info() << "stopped after " << pos.step << " steps (--max-steps)";
      break;
    }
    if (pos.epoch + 1 < options_.epochs && stopRequested(0)) {
      log_.info() << "stop requested (SIGUSR1): stopping after epoch " << pos.epoch + 1 << " (checkpointed)";
      result.stoppedEarly = result.stoppedBySignal = true;
      break;
    }
  }
  result.wallSeconds = secondsSince(start);
#ifdef COHORT_HAVE_CUDA
  if (deviceBatches) result.inputWaitMs = deviceBatches->inputWaitMs();
#endif
  return result;
}

void Trainer::collectGpuSums(Position& pos) {
#ifdef COHORT_HAVE_CUDA
  if (!options_.gpu) return;
  LossSums sums = loss_.takeGpuSums(*options_.gpu);
  pos.lossSum += sums.loss;
  pos.correct += sums.correct;
#endif
}

void Trainer::finishEpoch(Position& pos, TrainResult& result, double epochSeconds, int64_t epochSamples) {
  trainSeconds_ += epochSeconds;
  trainedSamples_ += epochSamples;
  result.trainLoss = pos.samples ? pos.lossSum / static_cast<double>(pos.samples) : 0;
  result.trainAcc = pos.samples ? static_cast<double>(pos.correct) / static_cast<double>(pos.samples) : 0;
  result.epochs = pos.epoch + 1;
  result.steps = pos.step;
  JobProgress job{trainedSamples_, trainSeconds_};
  if (sync_) {
    sync_->reportProgress(trainedSamples_, trainSeconds_, optimizer_.steps());
    if (!options_.checkpointPath.empty() && !sync_->replicated()) sync_->shareOptimizerState(optimizer_);
    sync_->barrier("end of epoch " + std::to_string(pos.epoch + 1));
    job = sync_->jobProgress();
    result.trainLoss = sync_->averageOverRanks(result.trainLoss);
    result.trainAcc = sync_->averageOverRanks(result.trainAcc);
  }
  result.samplesPerSec = job.trainSeconds > 0 ? static_cast<double>(job.samples) / job.trainSeconds : 0;
  if (test_ && world_.rank == 0) {
    Evaluation e = evaluate(*test_);
    result.testLoss = e.loss;
    result.testAcc = e.accuracy;
    result.haveTest = true;
  }
  auto line = log_.info();
  line << "epoch " << pos.epoch + 1 << "/" << options_.epochs << " step " << pos.step << " train_loss " << result.trainLoss;
  if (options_.classification) line << " train_acc " << result.trainAcc;
  if (result.haveTest) line << " test_loss " << result.testLoss;
  if (result.haveTest && options_.classification) line << " test_acc " << result.testAcc;
  line << " samples/s " << static_cast<int64_t>(epochSeconds > 0 ? static_cast<double>(epochSamples) / epochSeconds : 0);
  if (sync_) line << " (job " << static_cast<int64_t>(result.samplesPerSec) << ")";
  appendMetrics(pos, result);
  pos.lastTrainLoss = result.trainLoss;
  pos.lastTrainAcc = result.trainAcc;
  pos.lossSum = 0;
  pos.correct = 0;
  pos.samples = 0;
  if (!result.stoppedEarly) {
    Position next = pos;
    next.epoch = pos.epoch + 1;
    next.batch = 0;
    saveCheckpoint(next);
  }
  if (sync_) sync_->barrier("after epoch " + std::to_string(pos.epoch + 1));
}

bool Trainer::stopRequested(int64_t step) {
  const bool mine = options_.stopRequested && options_.stopRequested->load(std::memory_order_relaxed);
  if (!sync_) return mine;
  // Agreeing costs a small collective: every 16 steps (the same steps on every rank) is plenty for a
  // signal sent minutes before a time limit.
  constexpr int64_t kAgreeEvery = 16;
  if (step % kAgreeEvery != 0) return false;
  return sync_->anyRankStopping(mine);
}

TrainResult Trainer::alreadyDone(const Position& pos, Clock::time_point start) {
  log_.info() << "the checkpoint is at the end of epoch " << pos.epoch << ": nothing left to train for --epochs "
              << options_.epochs;
  TrainResult result;
  result.epochs = pos.epoch;
  result.steps = pos.step;
  result.trainLoss = pos.lastTrainLoss;
  result.trainAcc = pos.lastTrainAcc;
  if (test_ && world_.rank == 0) {
    Evaluation e = evaluate(*test_);
    result.testLoss = e.loss;
    result.testAcc = e.accuracy;
    result.haveTest = true;
  }
  result.wallSeconds = secondsSince(start);
  return result;
}

Evaluation Trainer::evaluate(const runtime::data::Dataset& data) {
  Pass pass;
  pass.training = false;
  pass.gpu = options_.gpu;
  double lossSum = 0;
  int64_t correct = 0;
  const int64_t n = data.size();
#ifdef COHORT_HAVE_CUDA
  if (options_.gpu) {
    // Chunks are copied to the device one at a time (evaluation is not the hot loop).
    auto& gpu = *options_.gpu;
    Tensor inputs, targets;
    for (int64_t first = 0; first < n; first += options_.evalBatchSize) {
      int64_t count = std::min(options_.evalBatchSize, n - first);
      Tensor hostIn = data.inputs().narrowRows(first, count), hostTgt = data.targets().narrowRows(first, count);
      gpu.stream().synchronize();  // the previous chunk's kernels are done with the device buffers
      runtime::ensureShape(inputs, hostIn.shape(), gpu.allocator());
      runtime::ensureShape(targets, hostTgt.shape(), gpu.allocator());
      runtime::cuda::copyToDevice(inputs.data(), hostIn.data(), hostIn.bytes(), gpu.stream());
      runtime::cuda::copyToDevice(targets.data(), hostTgt.data(), hostTgt.bytes(), gpu.stream());
      loss_.forwardGpu(model_.net->forward(inputs, pass), targets, gpu);
    }
    LossSums sums = loss_.takeGpuSums(gpu);
    return {n ? sums.loss / static_cast<double>(n) : 0, n ? static_cast<double>(sums.correct) / static_cast<double>(n) : 0};
  }
#endif
  for (int64_t first = 0; first < n; first += options_.evalBatchSize) {
    int64_t count = std::min(options_.evalBatchSize, n - first);
    const Tensor& out = model_.net->forward(data.inputs().narrowRows(first, count), pass);
    lossSum += static_cast<double>(loss_.forward(out, data.targets().narrowRows(first, count))) * static_cast<double>(count);
    correct += loss_.correct();
  }
  return {n ? lossSum / static_cast<double>(n) : 0, n ? static_cast<double>(correct) / static_cast<double>(n) : 0};
}

std::string Trainer::resultLine(const TrainResult& r) const {
  std::ostringstream os;
  os << "RESULT mode=" << options_.mode << " backend=" << options_.backend << " world_size=" << world_.worldSize
     << " epochs=" << r.epochs << " train_loss=" << r.trainLoss;
  if (r.haveTest) os << " test_loss=" << r.testLoss;
  if (r.haveTest && options_.classification) os << " test_acc=" << r.testAcc;
  os << " samples_per_s=" << static_cast<int64_t>(r.samplesPerSec) << " wall_s=" << r.wallSeconds;
  return os.str();
}

void Trainer::appendMetrics(const Position& pos, const TrainResult& r) const {
  if (options_.metricsPath.empty() || world_.rank != 0) return;
  nlohmann::json j = {{"epoch", pos.epoch + 1}, {"step", pos.step}, {"train_loss", r.trainLoss},
                      {"samples_per_s", r.samplesPerSec}};
  if (options_.classification) j["train_acc"] = r.trainAcc;
  if (r.haveTest) j["test_loss"] = r.testLoss;
  if (r.haveTest && options_.classification) j["test_acc"] = r.testAcc;
  std::ofstream out(options_.metricsPath, std::ios::app);
  out << j.dump() << "\n";
  if (!out) COHORT_THROW(IoError) << options_.metricsPath << ": cannot append metrics";
}

}  // namespace cohort::nn
