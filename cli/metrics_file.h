// A metrics file of `cohort train --metrics FILE`, read back for plotting (cli/plot.h).
//
// The file holds one JSON object per line (train/trainer.cc writes them): an epoch line per epoch, which
// alone carries "run_samples_per_s", with --log-every-steps N a step line every N optimizer steps, and
// with --eval-every N an evaluation line ("type": "eval", test_loss and test_acc) every N. Every line
// has "epoch" (1-based) and "step" (optimizer steps so far in the run); the figures read here are
// train_loss, test_loss, train_acc and test_acc, any of which may be absent (regression has no accuracy,
// a run without a test set no test figures, a GPU run's step lines no loss). Other keys (lr, samples/s,
// a callback's figures) are not read and may hold anything.
//
// Non-finite values are dropped and counted, never an error: nlohmann writes a NaN loss as null,
// and Python's json module writes bare NaN, Infinity and -Infinity, which are read as null too, as
// are numbers beyond a double's range (1e999, -1e999). Blank lines are skipped. Errors: a missing or
// unreadable file, or one that is not a regular file (a directory, a device such as /dev/zero, a
// FIFO or pipe), is IoError naming it and what it is; a line that is not a JSON object, lacks
// "epoch" or "step", or holds a non-number where a number belongs is InvalidArgument naming
// FILE:LINE and what is wrong. A file without one plottable figure is InvalidArgument naming it.
// Thread safety: a plain function of the file; values own their data.
//
//   MetricsFile m = readMetricsFile("run/metrics.jsonl");
//   for (const MetricsLine& e : m.epochs) use(e.step, e.trainLoss);
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace cohort::cli {

// One line's figures; NaN where the line lacks the key or its value is not finite.
struct MetricsLine {
  static constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();
  double epoch = 0;
  double step = 0;
  double trainLoss = kMissing;
  double testLoss = kMissing;
  double trainAcc = kMissing;
  double testAcc = kMissing;
};

struct MetricsFile {
  std::string path;
  std::vector<MetricsLine> epochs;  // epoch lines, in file order
  std::vector<MetricsLine> steps;   // --log-every-steps lines, in file order
  std::vector<MetricsLine> evals;   // --eval-every lines ("type": "eval"), in file order
  int64_t nonFinite = 0;            // figures dropped because they were null, NaN or infinite
};

MetricsFile readMetricsFile(const std::string& path);

}  // namespace cohort::cli
