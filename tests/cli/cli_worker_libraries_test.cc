// A training worker loads no drawing library (issue 33): `cohort` once linked cairo, and with it
// X11, xcb, freetype, fontconfig, pixman and png, which every worker loaded at start (18 shared
// objects, 1.7 MiB resident) for a plot that only `cohort plot` and rank 0 of `--plot` draw.
// Now cairo is opened when a plot is drawn (cli/cairo_library.h; docs/build.md, "What a CPU worker
// costs"). The dynamic loader's own trace (LD_DEBUG=files, one file per process) names every shared
// object a process loads, linked or opened later, so this fails when any of them is linked into
// `cohort` again or opened by a run that does not plot; `cohort plot` must still open cairo (which
// also shows that the trace works here).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

// The file names of cairo and what it brings in, as the loader asks for them (libcairo.so.2,
// libX11.so.6, ...), without their versions.
const std::vector<std::string> kDrawingLibraries = {"libcairo.",      "libX11.",    "libXext.",
                                                    "libXrender.",    "libxcb",     "libfreetype.",
                                                    "libfontconfig.", "libpixman-", "libpng"};

struct LoadedLibrary {
  std::string name;  // the file's name, without its folder
  std::string how;   // "needed by ..." (linked) or "dynamically loaded by ..." (dlopen)
};

// Every "file=NAME [ns];  needed by|dynamically loaded by WHO" line of the loader's trace files
// (ld.PID) in `dir`: one per library loaded, linked or opened.
std::vector<LoadedLibrary> loadedLibraries(const std::string& dir) {
  std::vector<LoadedLibrary> loaded;
  for (const std::string& name : listDir(dir)) {
    if (name.rfind("ld.", 0) != 0) continue;
    for (const std::string& line : linesWith(readFile(dir + "/" + name), "file=")) {
      const size_t at = line.find("file=") + 5;
      std::string file = line.substr(at, line.find(' ', at) - at);
      file = file.substr(file.rfind('/') + 1);
      // Not "generating link map" and the like, which follow for the same file.
      const size_t how = std::min(line.find("needed by", at), line.find("dynamically loaded by", at));
      if (how != std::string::npos) loaded.push_back({file, line.substr(how)});
    }
  }
  return loaded;
}

bool isDrawingLibrary(const std::string& file) {
  for (const std::string& prefix : kDrawingLibraries) {
    if (file.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

class WorkerLibrariesTest : public ShmDirTest {
 protected:
  // Runs `cohort ARGS` with the loader's trace written to dir_/trace/ld.PID; returns what it loaded.
  std::vector<LoadedLibrary> runTraced(const std::vector<std::string>& args) {
    const std::string trace = dir_ + "/trace";
    EXPECT_EQ(::mkdir(trace.c_str(), 0700), 0);
    CommandOptions options;
    options.extraEnvironment = {"LD_DEBUG=files", "LD_DEBUG_OUTPUT=" + trace + "/ld"};
    CommandResult r = runCohort(args, options);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    EXPECT_EQ(parseResultLine(r.stdoutText).count, 1) << r.describe();
    std::vector<LoadedLibrary> loaded = loadedLibraries(trace);
    // oneDNN is linked: a trace without it is no trace (LD_DEBUG ignored), and would prove nothing.
    bool haveDnnl = false;
    for (const LoadedLibrary& l : loaded) haveDnnl |= l.name.rfind("libdnnl.", 0) == 0;
    EXPECT_TRUE(haveDnnl) << "the loader's trace does not show oneDNN: LD_DEBUG=files did not work here";
    return loaded;
  }
};

TEST_F(WorkerLibrariesTest, ATrainingWorkerLoadsNoDrawingLibrary) {
  std::ostringstream csv;
  for (int row = 0; row < 64; ++row) csv << (row % 4) * 0.25 << "," << (row % 3) * 0.5 << "," << row % 2 << "\n";
  writeFile(dir_ + "/rows.csv", csv.str());
  const std::vector<LoadedLibrary> loaded =
      runTraced({"train", "--data", "csv:" + dir_ + "/rows.csv", "--model", "mlp:2,4,2", "--loss", "ce", "--epochs",
                 "1", "--batch-size", "16", "--threads", "1", "--progress-every", "0"});
  std::string drawing;
  for (const LoadedLibrary& l : loaded) {
    if (isDrawingLibrary(l.name)) drawing += "\n  " + l.name + " (" + l.how + ")";
  }
  EXPECT_EQ(drawing, "") << "a training worker loads drawing libraries; cairo must be opened only to draw "
                            "(cli/cairo_library.h), not linked, and so must what it needs:"
                         << drawing;
}

TEST_F(WorkerLibrariesTest, CohortPlotOpensCairoWhenItDraws) {
  writeFile(dir_ + "/m.jsonl",
            "{\"epoch\":1,\"step\":8,\"train_loss\":1.5,\"test_loss\":1.75}\n"
            "{\"epoch\":2,\"step\":16,\"train_loss\":1.25,\"test_loss\":1.5}\n");
  const std::vector<LoadedLibrary> loaded = runTraced({"plot", dir_ + "/m.jsonl", "--output", dir_ + "/m.png"});
  std::set<std::string> opened;
  for (const LoadedLibrary& l : loaded) {
    if (l.name.rfind("libcairo.", 0) == 0) {
      opened.insert(l.name);
      EXPECT_EQ(l.how.rfind("dynamically loaded by", 0), 0u) << l.name << " is " << l.how;
    }
  }
  EXPECT_EQ(opened, std::set<std::string>{"libcairo.so.2"});
  EXPECT_TRUE(fileExists(dir_ + "/m.png"));
}

}  // namespace
}  // namespace cohort::testing
