// MetricsSink: where rank 0 writes a run's figures — the metrics file (JSON lines, appended) and
// TensorBoard scalars (train/observe/tensorboard_writer.h) — one line per epoch and, with
// TrainerOptions::logEverySteps, one every N steps, and with evalEverySteps an "eval" line per
// evaluation. Every numeric field of a line becomes a scalar at the line's step, under the tag
// docs/observing.md lists (tensorboardTag).
//
// The metrics file is opened once, for appending, only when it is a regular file of this user:
// "PATH: is a FIFO or pipe, not a regular file" (likewise a device, socket; IoError, as --data
// says it), and "PATH: is owned by user X (uid N), not you" for another user's file. A symbolic
// link is followed only when the link and the file it names are both this user's (a link you made
// to your own file; not one another user planted, e.g. in /tmp): else "PATH: is a symbolic link
// owned by ...". The open never blocks (O_NONBLOCK: a FIFO is refused, not waited on).
// A file that ends in a torn line (a run killed mid-write, a disk that filled) is cut back to its
// last whole line at open; tornLineCutAt() says where, for the caller's warning.
// Each line is one write(2) of the whole line, checked; a line that cannot be written whole is cut
// off again (ftruncate to where it began), and the sink records the failure, writes nothing more,
// and failure() names it: the Trainer then stops the run at its next checkpoint (exit 2).
// Ownership: owns its TensorBoard writer and the file. Thread safety: the training thread only.
//
//   MetricsSink sink(options.metricsPath, options.tensorboardDir);   // IoError if DIR is unwritable
//   sink.epoch(report, /*classification=*/true);
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "runtime/unique_fd.h"
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
  double msPerStep = 0;             // wall time per optimizer step over the window
  std::optional<double> tokensPerSec;  // a language model's (samples/s x its positions per sample)
  std::optional<double> mfu;           // model FLOPs utilisation in [0, 1] (train/observe/mfu.h), where known
};

// An evaluation while training (TrainerOptions::evalEverySteps): an "eval" line.
struct EvalFigures {
  int64_t epoch = 0;  // from 1: the epoch the step is in
  int64_t step = 0;   // optimizer steps so far (0: before the first)
  double testLoss = 0;
  std::optional<double> testAcc;  // classification only
  int64_t samples = 0;            // test samples evaluated
};

// Which line a figure comes from: an epoch's, a step line (--log-every-steps) or an eval line.
enum class LineKind { kEpoch, kSteps, kEval };

// The TensorBoard tag of a metrics key: train_loss -> train/loss (also train_acc, test_loss,
// test_acc -> .../accuracy), the time report's keys under time/, a step line's under steps/, an eval
// line's test_loss and test_acc as eval/loss and eval/accuracy (others under eval/), the others as
// they are.
std::string tensorboardTag(const std::string& key, LineKind kind);

class MetricsSink {
 public:
  // Empty paths: nothing goes there. Creates the TensorBoard file now (IoError naming it).
  MetricsSink(std::string metricsPath, const std::string& tensorboardDir);
  ~MetricsSink();
  MetricsSink(const MetricsSink&) = delete;
  MetricsSink& operator=(const MetricsSink&) = delete;

  void epoch(const EpochReport& report, bool classification);
  void steps(const StepFigures& figures);
  // {"type": "eval", "epoch", "step", "test_loss", "test_acc" (classification), "test_samples"}.
  void eval(const EvalFigures& figures);

  // Where a torn last line was cut off at open (its byte offset), if the file had one.
  std::optional<uint64_t> tornLineCutAt() const { return tornLineCutAt_; }
  // "<path>: cannot append metrics: <errno text>" once a write has failed; empty before.
  const std::string& failure() const { return failure_; }

 private:
  void publish(const nlohmann::json& line, LineKind kind);
  void append(const std::string& line);

  std::string metricsPath_;
  runtime::UniqueFd file_;
  std::optional<uint64_t> tornLineCutAt_;
  std::string failure_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

}  // namespace cohort::train
