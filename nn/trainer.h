// Trainer: the training loop every worker runs (DESIGN.md §1), readable on one screen.
//
//   for epoch: loader.startEpoch(epoch, firstBatch)
//     for batch: forward -> loss -> backward -> optimizer.step -> (checkpoint every N steps)
//     evaluate on the test set; log one progress line; append one metrics line
//
// With a JobSync (hogwild) all ranks meet at a barrier at the start and at each epoch's end; rank 0
// then evaluates, checkpoints (parameters plus every rank's optimizer state) and reports the job's
// throughput, while the others wait at a second barrier so nothing changes the parameters meanwhile.
//
// Checkpoints (safetensors, nn/checkpoint.h) hold the parameters, the optimizer state and step
// count, the epoch and the next batch of the data loader, the dropout Rng state and the running
// epoch sums, so a run resumed from any checkpoint continues bit for bit like the uninterrupted run
// (on CPU). They are written every `checkpointEvery` steps (if > 0) and at the end of every epoch.
// The Trainer borrows everything it is given; all of it must outlive run().
// Thread safety: run() is called from one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "nn/job_sync.h"
#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/data/data_loader.h"
#include "runtime/logging.h"
#include "runtime/world_info.h"

namespace cohort::nn {

struct TrainerOptions {
  int64_t epochs = 1;
  uint64_t seed = 0;             // dropout masks (the loader and init have their own seeds)
  bool classification = true;    // report accuracy
  std::string checkpointPath;    // empty: no checkpoints
  int64_t checkpointEvery = 0;   // steps; 0: at the end of each epoch only
  bool resume = false;           // continue from checkpointPath if it exists
  int64_t maxSteps = 0;          // > 0: stop after this many optimizer steps in all (checkpointed)
  // Set asynchronously (a SIGUSR1 handler): stop after the current step, write the checkpoint and
  // return. Local and allreduce modes (ranks agree on the step); Hogwild ignores it.
  const std::atomic<bool>* stopRequested = nullptr;
  std::string metricsPath;       // JSON lines; empty: none
  int64_t evalBatchSize = 1000;
  std::string mode = "local";    // for the RESULT line
  std::string backend = "none";
  // Hogwild: the parameters live in shared memory, loaded from the checkpoint by the segment's
  // creator before the others attach; the Trainer then resumes only its own state.
  bool paramsShared = false;
  // Sharded synchronous training (nn/sharded_sync.h): the optimizer state is one buffer in shared
  // memory too, which local rank 0 loads from the checkpoint before the others pass the start barrier.
  bool optimizerStateShared = false;
  // Train on this GPU (CUDA builds): the model's parameters, the optimizer's state and the loss live
  // on its device; batches are copied ahead on a copy stream (runtime/data/device_loader.h); the
  // loss sums are read from the device at checkpoints and epoch ends only.
  runtime::cuda::GpuContext* gpu = nullptr;
};

struct TrainResult {
  int64_t epochs = 0;
  int64_t steps = 0;
  bool stoppedEarly = false;  // maxSteps reached (or a stop requested) before the last epoch ended
  bool stoppedBySignal = false;
  double trainLoss = 0;  // mean over the last epoch
  double trainAcc = 0;
  double testLoss = 0;
  double testAcc = 0;
  bool haveTest = false;
  double samplesPerSec = 0;  // the job's training samples / training time (evaluation excluded)
  double wallSeconds = 0;
  double inputWaitMs = 0;    // GPU: how long the compute stream waited for input batches
};

// Loads the parameters stored in the checkpoint at `path` into `params` (names and sizes must match);
// used by the creator of a shared parameter segment before the other ranks attach.
void loadParamsFromCheckpoint(const std::string& path, const ParamBuffer& params);

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

class Trainer {
 public:
  Trainer(Model& model, Optimizer& optimizer, Loss& loss, runtime::data::DataLoader& train,
          const runtime::data::Dataset* test, const runtime::WorldInfo& world, const runtime::Logger& log,
          TrainerOptions options, JobSync* sync = nullptr);

  TrainResult run();
  Evaluation evaluate(const runtime::data::Dataset& data);
  // The RESULT line of DESIGN.md §4 for `result`.
  std::string resultLine(const TrainResult& result) const;

 private:
  struct Position {
    int64_t epoch = 0;
    int64_t batch = 0;  // next batch within the epoch
    int64_t step = 0;   // optimizer steps so far
    double lossSum = 0;  // running sums of the current epoch
    int64_t correct = 0;
    int64_t samples = 0;
    double lastTrainLoss = 0;  // figures of the last completed epoch
    double lastTrainAcc = 0;
  };

  using Clock = std::chrono::steady_clock;
  static double secondsSince(Clock::time_point t);
  TrainResult alreadyDone(const Position& pos, Clock::time_point start);
  // Whether to stop now: this process's request, agreed with the other ranks where they step together.
  bool stopRequested(int64_t step);
  void saveCheckpoint(const Position& pos);
  // Every rank calls this at an epoch's end; rank 0 evaluates, logs and checkpoints in between.
  void finishEpoch(Position& pos, TrainResult& result, double epochSeconds, int64_t epochSamples);
  bool loadCheckpoint(Position& pos);
  // GPU: adds the loss sums accumulated on the device to `pos` (waits for the compute stream).
  void collectGpuSums(Position& pos);
  void appendMetrics(const Position& pos, const TrainResult& epochResult) const;

  Model& model_;
  Optimizer& optimizer_;
  Loss& loss_;
  runtime::data::DataLoader& train_;
  const runtime::data::Dataset* test_;
  const runtime::WorldInfo& world_;
  const runtime::Logger& log_;
  TrainerOptions options_;
  JobSync* sync_;  // nullptr for --mode local
  runtime::Rng rng_;
  double trainSeconds_ = 0;  // this rank's, over the epochs run in this process
  int64_t trainedSamples_ = 0;
};

}  // namespace cohort::nn
