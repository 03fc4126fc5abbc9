// What one CPU worker costs before its data (issue 15): `cohort train --memory-report` on a
// 4,794-parameter MLP (mlp:784,6,10) and 256 CSV rows, alone and as each of 2 workers under
// cohortrun (allreduce over shm, and hogwild), must peak under 40 MB resident. It measured about
// 229 MB when the CUDA build linked cuBLAS, cuDNN and NCCL (cuBLASLt alone is ~200 MB at start),
// and about 16 MB since they are opened only by a GPU run (docs/build.md, "What a CPU worker
// costs"), so a library that comes back at start, or a new fixed cost, fails here. Resident memory
// does not depend on the machine's load, so the bound holds on a busy 2-core machine.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

constexpr double kBudgetBytes = 40e6;  // the budget: 40 MB

std::string cohortrunBinary() { return runfile("launcher/cohortrun"); }

// 256 rows of 784 features (multiples of 1/8) and a class 0..9: the data is 0.8 MB in memory.
std::string writeCsv(const std::string& dir) {
  std::ostringstream csv;
  for (int row = 0; row < 256; ++row) {
    for (int j = 0; j < 784; ++j) csv << ((row * 7 + j * 3) % 8) * 0.125 << ",";
    csv << row % 10 << "\n";
  }
  writeFile(dir + "/rows.csv", csv.str());
  return dir + "/rows.csv";
}

// The bytes of every "memory report (cpu): peak resident <x> <unit>" line, in order.
std::vector<double> peakResidents(const std::string& stdoutText) {
  std::vector<double> peaks;
  const std::string key = "memory report (cpu): peak resident ";
  for (const std::string& line : linesWith(stdoutText, key)) {
    std::istringstream in(line.substr(line.find(key) + key.size()));
    double value = 0;
    std::string unit;
    in >> value >> unit;
    unit = unit.substr(0, unit.find_first_not_of("BKMGi"));  // "MiB;" when more figures follow
    const double scale = unit == "B"     ? 1
                         : unit == "KiB" ? 1 << 10
                         : unit == "MiB" ? 1 << 20
                         : unit == "GiB" ? 1 << 30
                                         : 0;
    EXPECT_GT(scale, 0) << "unit '" << unit << "' in: " << line;
    peaks.push_back(value * scale);
  }
  return peaks;
}

class MemoryCliTest : public ShmDirTest {
 protected:
  std::vector<std::string> trainArgs() {
    return {cohortBinary(),   "train",
            "--data",         "csv:" + writeCsv(dir_),
            "--model",        "mlp:784,6,10",
            "--loss",         "ce",
            "--epochs",       "2",
            "--batch-size",   "32",
            "--threads",      "1",
            "--memory-report"};
  }

  // Runs `worker` (under cohortrun with `workers` > 1) and checks each worker's peak.
  void expectWithinBudget(int workers, const std::vector<std::string>& extra) {
    std::vector<std::string> argv;
    if (workers > 1) argv = {cohortrunBinary(), "--nproc-per-node", std::to_string(workers), "--"};
    const std::vector<std::string> worker = trainArgs();
    argv.insert(argv.end(), worker.begin(), worker.end());
    argv.insert(argv.end(), extra.begin(), extra.end());
    CommandResult r = runCommand(argv, {.timeout = std::chrono::seconds(120)});
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    ASSERT_EQ(parseResultLine(r.stdoutText).count, 1) << r.describe();
    const std::vector<double> peaks = peakResidents(r.stdoutText);
    ASSERT_EQ(peaks.size(), static_cast<size_t>(workers)) << r.stdoutText;
    for (double peak : peaks) {
      EXPECT_GT(peak, 1e6) << r.stdoutText;  // a sane reading
      EXPECT_LT(peak, kBudgetBytes) << "a CPU worker peaked at " << peak / 1e6 << " MB:\n" << r.stdoutText;
    }
    EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
  }
};

TEST_F(MemoryCliTest, OneWorkerAlone) { expectWithinBudget(1, {}); }
TEST_F(MemoryCliTest, TwoWorkersAllReduceOverShm) {
  expectWithinBudget(2, {"--mode", "allreduce", "--backend", "shm"});
}
TEST_F(MemoryCliTest, TwoHogwildWorkers) { expectWithinBudget(2, {"--mode", "hogwild"}); }

// Issue 44, item 16: a GPT's activations count in the floor. At a context of 16384 attention's
// probabilities (32 GiB per block at batch 2) over 4 blocks and their gradient (one for all blocks:
// nn/gpt_memory.h) alone are 160 GiB: refused before anything is allocated (exit 5), the message
// naming them and the limit that applied. Before, the floor counted the weights and the logits
// (1 GiB) only, and the run went on to allocate. With --recompute full (issue 46, item 2) one
// block's probabilities are held, and their gradient: 64 GiB.
TEST_F(MemoryCliTest, AGptsAttentionAtALongContextCountsInTheFloor) {
  writeFile(dir_ + "/text.txt", std::string(200000, 'a'));
  CommandResult r =
      runCohort({"train", "--threads", "1", "--data", "text:" + dir_ + "/text.txt", "--model",
                 "gpt:layers=4,heads=16,dim=64,ctx=16384,vocab=256", "--batch-size", "2", "--progress-every", "0"},
                {.timeout = std::chrono::seconds(60)});
  EXPECT_EQ(r.exitCode, 5) << r.describe();
  EXPECT_EQ(countLines(r.stderrText), 1) << r.describe();
  EXPECT_NE(r.stderrText.find("the activations its backward keeps at --recompute none "), std::string::npos)
      << r.describe();
  EXPECT_NE(r.stderrText.find("(attention's T×T scores and their gradient 160.0 GiB)"), std::string::npos)
      << r.describe();
  EXPECT_NE(r.stderrText.find(" available (the "), std::string::npos) << "which limit applied?\n" << r.describe();
  r = runCohort({"train", "--threads", "1", "--data", "text:" + dir_ + "/text.txt", "--model",
                 "gpt:layers=4,heads=16,dim=64,ctx=16384,vocab=256", "--batch-size", "2", "--progress-every", "0",
                 "--recompute", "full"},
                {.timeout = std::chrono::seconds(60)});
  EXPECT_EQ(r.exitCode, 5) << r.describe();
  EXPECT_NE(r.stderrText.find("at --recompute full "), std::string::npos) << r.describe();
  EXPECT_NE(r.stderrText.find("(attention's T×T scores and their gradient 64.0 GiB)"), std::string::npos)
      << r.describe();
}

}  // namespace
}  // namespace cohort::testing
