// `cohort plot`: training curves from metrics files, drawn into a PNG or SVG image (cli/plot.h).
//
//   cohort plot METRICS.jsonl [MORE.jsonl ...] --output FILE.png|FILE.svg [--x step|epoch]
//               [--width W] [--height H] [--title T] [--label NAME ...]
//
// Several files are overlaid, a colour each, named in the legend by --label (one per file, in order)
// or by file name. Prints "RESULT plot output=FILE runs=N points=P" and, when values were skipped
// as non-finite, a note on stderr. Errors (exit 2) as cli/plot.h says, and a --label count other
// than the files' or an --x other than step or epoch.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace cohort::cli {

struct PlotFlags {
  std::vector<std::string> metrics;  // the files, in legend order
  std::vector<std::string> labels;
  std::string output;
  std::string x = "step";
  int width = 960;
  int height = 540;
  std::string title;
};

void addPlotFlags(CLI::App& app, PlotFlags& flags);
int runPlot(const PlotFlags& flags);

}  // namespace cohort::cli
