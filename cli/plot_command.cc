#include "cli/plot_command.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/plot.h"  // writePlot
#include "runtime/error.h"

namespace cohort::cli {

void addPlotFlags(CLI::App& c, PlotFlags& f) {
  c.add_option("metrics", f.metrics, "metrics files written by cohort train --metrics (JSON lines)")->required();
  c.add_option("--output,-o", f.output, "the image to write: FILE.png or FILE.svg")->required();
  c.add_option("--x", f.x, "step | epoch: the horizontal axis")->capture_default_str();
  c.add_option("--width", f.width, "image width in pixels")->capture_default_str();
  c.add_option("--height", f.height, "image height in pixels")->capture_default_str();
  c.add_option("--title", f.title, "the title (default: \"Training curves: \" and the file name or the run count)");
  // One value per --label, so that the metrics files after it are not taken for labels.
  c.add_option("--label", f.labels, "the legend's name for each file, in order (default: the file names)")
      ->allow_extra_args(false);
}

int runPlot(const PlotFlags& f) {
  PlotOptions options{.outputPath = f.output, .width = f.width, .height = f.height, .title = f.title};
  if (f.x == "epoch")
    options.x = PlotAxis::kEpoch;
  else if (f.x != "step")
    COHORT_THROW(InvalidArgument) << "unknown --x '" << f.x << "': expected step or epoch";
  if (!f.labels.empty() && f.labels.size() != f.metrics.size()) {
    COHORT_THROW(InvalidArgument) << f.labels.size() << " --label for " << f.metrics.size()
                                  << " metrics files: give one per file, in order, or none";
  }
  std::vector<PlotRun> runs;
  for (size_t i = 0; i < f.metrics.size(); ++i) runs.push_back({f.metrics[i], f.labels.empty() ? "" : f.labels[i]});
  const PlotSummary summary = writePlot(runs, options);
  if (summary.nonFinite > 0) {
    std::fprintf(stderr, "cohort plot: note: skipped %lld non-finite values (null, NaN or infinite)\n",
                 static_cast<long long>(summary.nonFinite));
  }
  std::printf("RESULT plot output=%s runs=%d points=%lld\n", f.output.c_str(), summary.runs,
              static_cast<long long>(summary.points));
  return 0;
}

}  // namespace cohort::cli
