// Training curves drawn from metrics files (`cohort train --metrics`, read by cli/metrics_file.h)
// into a PNG or SVG image, with cairo: `cohort plot`, and a run's own plot after training.
//
// The image has a title, a legend (a colour per run, named by its label; the line styles) and one or
// two panels side by side (stacked when the image is taller than wide), against the step (default)
// or the epoch:
//   loss      train_loss (solid) and test_loss (dashed) of the epoch lines, test_loss with the eval
//             lines' (--eval-every) at their steps; the step lines'
//             train_loss (--log-every-steps), when there are any, as a thin, light curve beneath;
//   accuracy  train_acc and test_acc, only when some run has accuracy.
// Epoch curves mark their points while there are few. Axes have "nice" ticks (1, 2 or 5 times a
// power of ten) and a light grid. Against the epoch, a step line sits at its fraction of the epoch
// (step / steps per epoch). A resumed run appends lines again for steps it had already logged: points
// are sorted by x and, of several at the same x, the last in the file is drawn. Non-finite values are
// skipped (counted in the summary). The output is written to a temporary file and renamed, so a
// failed plot leaves nothing; the same inputs and options give the same bytes.
//
// Errors: an output whose extension is not .png or .svg, a size out of range, or a bad metrics line
// is InvalidArgument; an unreadable metrics file or an unwritable output is IoError (both exit 2).
// Thread safety: none needed; each call owns its cairo surface.
//
//   writePlot("run/metrics.jsonl", {.outputPath = "run/curves.png"});
//   writePlot({{"a.jsonl", "lr 0.1"}, {"b.jsonl", "lr 0.05"}}, {.outputPath = "ab.svg", .x = PlotAxis::kEpoch});
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cohort::cli {

enum class PlotAxis { kStep, kEpoch };

struct PlotRun {
  std::string metricsPath;
  std::string label;  // the legend's name; empty: the file's name (with enough of its folders to be unique)
};

struct PlotOptions {
  std::string outputPath;  // .png or .svg (either case)
  int width = 960;         // pixels, 240 to 16384
  int height = 540;        // pixels, 180 to 16384
  PlotAxis x = PlotAxis::kStep;
  std::string title;  // empty: "Training curves: LABEL", or ": N runs"
};

struct PlotSummary {
  int runs = 0;
  int64_t points = 0;     // points drawn, over all curves
  int64_t nonFinite = 0;  // values skipped because they were null, NaN or infinite
};

PlotSummary writePlot(const std::vector<PlotRun>& runs, const PlotOptions& options);
// One run, labelled by its file name.
PlotSummary writePlot(const std::string& metricsPath, const PlotOptions& options);

// Where the metrics of `cohort train --plot` without --metrics go: a directory of the run's own in
// $TMPDIR (else /tmp), made by mkdtemp (0700, an unpredictable name), so that no file the user never
// named can fail the run, and no other user can create the name first (docs/security.md; it was the
// fixed cohort-plot-<pid>.metrics.jsonl). The destructor removes the file and the directory, however
// the run ends. IoError naming the directory when it cannot be made.
class PlotMetricsFile {
 public:
  PlotMetricsFile();
  ~PlotMetricsFile();
  PlotMetricsFile(const PlotMetricsFile&) = delete;
  PlotMetricsFile& operator=(const PlotMetricsFile&) = delete;
  std::string path() const { return directory_ + "/metrics.jsonl"; }

 private:
  std::string directory_;
};

}  // namespace cohort::cli
