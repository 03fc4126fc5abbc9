// Issue 16, the divergence guard end to end: `--lr 1e6` makes the loss or the gradient non-finite
// within the first steps. The run stops at that step with exit code 6 and a line naming the step,
// the rank and the value (every worker of a 2-worker allreduce job at the same step), and the
// checkpoint written every step is byte-identical to that of a run stopped just before (--max-steps).
// `--skip-nonfinite N` skips N such steps (each one logged) before stopping the same way.
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"
#include "tests/support/process.h"

namespace cohort::testing {
namespace {

class DivergenceTest : public ShmDirTest {
 protected:
  std::vector<std::string> train(const std::string& checkpoint, const std::vector<std::string>& extra) const {
    std::vector<std::string> a = {cohortBinary(), "train", "--data", "synthetic", "--model", "mlp:784,64,10", "--lr", "1e6",
                                  "--seed", "5", "--threads", "1", "--batch-size", "32", "--checkpoint", checkpoint,
                                  "--checkpoint-every", "1"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  std::vector<std::string> launched(int workers, std::vector<std::string> worker) const {
    if (workers == 1) return worker;
    std::vector<std::string> v = {runfile("launcher/cohortrun"), "--nproc-per-node", std::to_string(workers), "--"};
    v.insert(v.end(), worker.begin(), worker.end());
    return v;
  }

  // The workers of a job started by hand with cohortrun's variables, so that every worker runs to its
  // own end (a launcher stops the others when the first fails): their output, "rc R: C" per worker.
  CommandResult byHand(int workers, const std::vector<std::string>& worker) const {
    std::string quoted;
    for (const auto& a : worker) quoted += " '" + a + "'";
    const std::string script = "for r in $(seq 0 " + std::to_string(workers - 1) + "); do (RANK=$r LOCAL_RANK=$r WORLD_SIZE=" +
                               std::to_string(workers) + " LOCAL_WORLD_SIZE=" + std::to_string(workers) +
                               " COHORT_JOB_ID=diverge$$" + quoted + "; echo \"rc $r: $?\") & done; wait";
    return runCommand({"/bin/sh", "-c", script}, {.timeout = std::chrono::seconds(240)});
  }

  // Runs the diverging job, checks what every worker said, and compares its checkpoint with a run
  // stopped by --max-steps at the step before. `extra`: flags for both (the mode).
  void expectStopAndUntouchedCheckpoint(int workers, const std::vector<std::string>& extra) {
    const std::string diverged = dir_ + "/diverged.st", reference = dir_ + "/reference.st";
    CommandResult r = workers == 1 ? runCommand(train(diverged, extra)) : byHand(workers, train(diverged, extra));
    if (workers == 1) {
      ASSERT_EQ(r.exitCode, 6) << r.describe();
    } else {
      for (int k = 0; k < workers; ++k) {
        EXPECT_NE(r.stdoutText.find("rc " + std::to_string(k) + ": 6"), std::string::npos) << r.describe();
      }
    }
    // One line per worker: "cohort: error: step S (epoch 1, batch S): the loss is non-finite on rank Q ..."
    const std::regex line(R"(cohort: error: step (\d+) \(epoch 1, batch \d+\): the (loss is non-finite on rank \d+|gradient is non-finite)[^\n]*training diverged)");
    std::set<std::string> steps;
    size_t lines = 0;
    const std::string& text = r.stderrText;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator(); ++it, ++lines) {
      steps.insert((*it)[1]);
    }
    ASSERT_EQ(lines, static_cast<size_t>(workers)) << r.describe();
    ASSERT_EQ(steps.size(), 1u) << "the workers stopped at different steps\n" << r.describe();
    const int step = std::atoi(steps.begin()->c_str());
    EXPECT_GE(step, 2) << "diverged before a first checkpoint";
    EXPECT_LE(step, 10) << "took too long to notice";
    EXPECT_EQ(r.stdoutText.find("RESULT"), std::string::npos) << r.describe();
    std::vector<std::string> before = extra;
    before.insert(before.end(), {"--max-steps", std::to_string(step - 1)});
    CommandResult s = runCommand(launched(workers, train(reference, before)), {.timeout = std::chrono::seconds(240)});
    ASSERT_EQ(s.exitCode, 0) << s.describe();
    EXPECT_TRUE(readFile(diverged) == readFile(reference)) << "the checkpoint of step " << step - 1 << " was changed";
    for (const std::string& name : listDir(dir_)) EXPECT_NE(name.front(), '.') << "left behind: " << name;
    EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
  }
};

TEST_F(DivergenceTest, ALocalRunStopsAtTheFirstNonFiniteStepAndKeepsTheLastCheckpoint) {
  expectStopAndUntouchedCheckpoint(1, {"--mode", "local"});
}

TEST_F(DivergenceTest, TwoAllreduceWorkersStopAtTheSameStep) {
  expectStopAndUntouchedCheckpoint(2, {"--mode", "allreduce"});
  expectStopAndUntouchedCheckpoint(2, {"--mode", "allreduce", "--replicas"});
  // Under cohortrun the job exits with the workers' code.
  CommandResult r = runCommand(launched(2, train(dir_ + "/launched.st", {"--mode", "allreduce"})),
                               {.timeout = std::chrono::seconds(240)});
  EXPECT_EQ(r.exitCode, 6) << r.describe();
  EXPECT_NE(r.stderrText.find("training diverged"), std::string::npos) << r.describe();
}

TEST_F(DivergenceTest, SkipNonFiniteSkipsThatManyStepsThenStops) {
  CommandResult r = runCommand(train(dir_ + "/skip.st", {"--skip-nonfinite", "2"}), {.timeout = std::chrono::seconds(120)});
  ASSERT_EQ(r.exitCode, 6) << r.describe();
  const std::string all = r.stdoutText + r.stderrText;
  int skipped = 0;
  for (size_t at = 0; (at = all.find("skipped, nothing applied", at)) != std::string::npos; ++at) ++skipped;
  EXPECT_EQ(skipped, 2) << r.describe();
  EXPECT_NE(r.stderrText.find("the 2 skips allowed are used up"), std::string::npos) << r.describe();
}

TEST_F(DivergenceTest, BadValuesAreUsageErrors) {
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--clip-grad-norm", "-1"},
                                              std::vector<std::string>{"--clip-grad-norm", "nan"},
                                              std::vector<std::string>{"--skip-nonfinite", "-1"}}) {
    CommandResult r = runCommand(train(dir_ + "/bad.st", bad), {.timeout = std::chrono::seconds(60)});
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_NE(r.stderrText.find(bad[0]), std::string::npos) << r.describe();
  }
}

}  // namespace
}  // namespace cohort::testing
