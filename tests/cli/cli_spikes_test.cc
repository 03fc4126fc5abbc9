// Issue 33 item 10, the spike rule end to end (`--skip-spikes Z`; train/step.h, "Spikes"): a
// regression set with one corrupt row (a target of 100 among targets within ±4) whose batch makes the
// loss and the gradient jump while both stay finite. Without the rule the run ends with exit 0 and
// a wrecked network; with it the corrupt row's steps are skipped (logged, counted as
// skipped_spikes), the test loss stays that of a clean run, and the workers of an allreduce job skip
// the same steps. Too many spikes in a row stop the run with exit code 6.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"
#include "tests/support/process.h"

namespace cohort::testing {
namespace {

class SpikesTest : public ShmDirTest {
 protected:
  void SetUp() override {
    ShmDirTest::SetUp();
    // y = w·x + noise over 4 features in [-1, 1]; 800 rows, the 500th corrupt.
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> u(-1, 1);
    const double w[4] = {0.5, -1.0, 0.25, 2.0};
    auto rows = [&](int n, int corrupt) {
      std::ostringstream csv;
      csv << "a,b,c,d,y\n";
      for (int i = 0; i < n; ++i) {
        double x[4], y = 0;
        for (int k = 0; k < 4; ++k) y += w[k] * (x[k] = u(rng));
        y += 0.01 * u(rng);
        if (i == corrupt) y = 100;
        csv << x[0] << "," << x[1] << "," << x[2] << "," << x[3] << "," << y << "\n";
      }
      return csv.str();
    };
    writeFile(dir_ + "/train.csv", rows(800, 500));
    writeFile(dir_ + "/test.csv", rows(200, -1));
  }

  std::vector<std::string> train(const std::vector<std::string>& extra) const {
    std::vector<std::string> a = {cohortBinary(), "train", "--data", "csv:" + dir_ + "/train.csv", "--test-data",
                                  "csv:" + dir_ + "/test.csv", "--loss", "mse", "--model", "mlp:4,16,1", "--lr", "0.05",
                                  "--batch-size", "8", "--epochs", "3", "--seed", "1", "--threads", "1"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::vector<std::string> launched(int workers, const std::vector<std::string>& worker) const {
    std::vector<std::string> v = {runfile("launcher/cohortrun"), "--nproc-per-node", std::to_string(workers), "--"};
    v.insert(v.end(), worker.begin(), worker.end());
    return v;
  }
  static double field(const std::string& text, const std::string& name) {
    const std::regex re(" " + name + "=([^ \n]+)");
    std::smatch m;
    if (!std::regex_search(text, m, re)) return std::nan("");
    return std::strtod(m[1].str().c_str(), nullptr);
  }
  // "step S (epoch E, batch B): the loss spiked on rank R ...: skipped" lines, as "S:R".
  static std::vector<std::string> skippedSteps(const std::string& text) {
    const std::regex re(R"(step (\d+) \(epoch \d+, batch \d+\): the loss spiked on rank (\d+)[^\n]*: skipped)");
    std::vector<std::string> out;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it) {
      out.push_back((*it)[1].str() + ":" + (*it)[2].str());
    }
    return out;
  }
};

// The corrupt row is in one batch per epoch (3 epochs). Without the rule the network it leaves
// behind is far worse than with it; with it, exactly those steps are skipped.
TEST_F(SpikesTest, OneWorkerSkipsTheCorruptBatchOnly) {
  CommandResult plain = runCommand(train({}));
  ASSERT_EQ(plain.exitCode, 0) << plain.describe();
  CommandResult guarded = runCommand(train({"--skip-spikes", "6"}));
  ASSERT_EQ(guarded.exitCode, 0) << guarded.describe();
  EXPECT_EQ(field(guarded.stdoutText, "skipped_spikes"), 3) << guarded.describe();
  EXPECT_EQ(skippedSteps(guarded.stdoutText).size(), 3u) << guarded.describe();
  const double wrecked = field(plain.stdoutText, "test_loss"), kept = field(guarded.stdoutText, "test_loss");
  EXPECT_LT(kept, 0.05) << guarded.describe();
  EXPECT_GT(wrecked, 10 * kept) << "the corrupt row did not hurt the unguarded run:\n" << plain.describe();
  EXPECT_TRUE(std::isnan(field(plain.stdoutText, "skipped_spikes"))) << "the rule is off by default";
}

// Two workers, each with half of the epoch: only the one whose shard holds the corrupt row sees the
// spike, and both skip the same steps (the votes travel with the loss flags), naming that rank; in
// the shared-parameter (one copy per node) mode and with replicas.
TEST_F(SpikesTest, AllreduceWorkersSkipTogether) {
  for (const char* layout : {"--no-replicas", "--replicas"}) {
    SCOPED_TRACE(layout);
    CommandResult r = runCommand(launched(2, train({"--mode", "allreduce", layout, "--skip-spikes", "6"})),
                                 {.timeout = std::chrono::seconds(240)});
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    const std::vector<std::string> skipped = skippedSteps(r.stdoutText);
    EXPECT_EQ(skipped.size(), 3u) << "rank 0 says each skip once\n" << r.describe();
    EXPECT_EQ(field(r.stdoutText, "skipped_spikes"), 3) << r.describe();
    EXPECT_LT(field(r.stdoutText, "test_loss"), 0.05) << r.describe();
    EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
  }
}

// --spikes-in-a-row 0: the first spike stops the run, exit 6, naming the step and the limit.
TEST_F(SpikesTest, TooManyInARowStopTheRun) {
  CommandResult r = runCommand(train({"--skip-spikes", "6", "--spikes-in-a-row", "0"}));
  EXPECT_EQ(r.exitCode, 6) << r.describe();
  EXPECT_NE(r.stderrText.find("the loss spiked on rank 0"), std::string::npos) << r.describe();
  EXPECT_NE(r.stderrText.find("1 spikes in a row (at most 0 may be skipped in a row)"), std::string::npos)
      << r.describe();
  EXPECT_EQ(r.stdoutText.find("RESULT"), std::string::npos) << r.describe();
}

TEST_F(SpikesTest, BadValuesAreRefused) {
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"--skip-spikes", "-1"}, {"--skip-spikes", "inf"}, {"--skip-spikes", "nan"}, {"--spikes-in-a-row", "-2"}}) {
    CommandResult r = runCommand(train(bad));
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_NE(r.stderrText.find(bad[0]), std::string::npos) << r.describe();
  }
}

}  // namespace
}  // namespace cohort::testing
