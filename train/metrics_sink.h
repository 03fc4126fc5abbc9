// MetricsSink: where rank 0 writes a run's figures — the metrics file (JSON lines, appended) and
// TensorBoard scalars (train/tensorboard_writer.h) — one line per epoch and, with
// TrainerOptions::logEverySteps, one every N steps. Every numeric field of a line becomes a scalar
// at the line's step, under the tag docs/observing.md lists (tensorboardTag).
// Ownership: owns its TensorBoard writer. Thread safety: the training thread only.
//
//   MetricsSink sink(options.metricsPath, options.tensorboardDir);   // IoError if DIR is unwritable
//   sink.epoch(report, /*classification=*/true);
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "train/trainer.h"

namespace cohort::train {

class TensorBoardWriter;

// A --log-every-steps line: rank 0's figures over the last N steps.
struct StepFigures {
  int64_t epoch = 0;  // from 1
  int64_t step = 0;
  double lr = 0;
  double samplesPerSec = 0;
  std::optional<double> gradNorm;   // mean over the applied steps; none when none was
  std::optional<double> trainLoss;  // none on a GPU (the loss stays on the device until the epoch's end)
};

// The TensorBoard tag of a metrics key: train_loss -> train/loss (also train_acc, test_loss,
// test_acc -> .../accuracy), the time report's keys under time/, a step line's under steps/, the
// others as they are.
std::string tensorboardTag(const std::string& key, bool stepLine);

class MetricsSink {
 public:
  // Empty paths: nothing goes there. Creates the TensorBoard file now (IoError naming it).
  MetricsSink(std::string metricsPath, const std::string& tensorboardDir);
  ~MetricsSink();
  MetricsSink(const MetricsSink&) = delete;
  MetricsSink& operator=(const MetricsSink&) = delete;

  void epoch(const EpochReport& report, bool classification);
  void steps(const StepFigures& figures);

 private:
  std::string metricsPath_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

}  // namespace cohort::train
