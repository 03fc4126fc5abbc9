// ZeRO in a real memory cgroup (issue 46, item 4): 4 workers under cohortrun (allreduce over shm,
// --replicas, AdamW), moved into a cgroup of the test's own limited to 512 MiB (tests/support/
// memory_cgroup.h: v1's memory.limit_in_bytes here, v2's memory.max where delegated), train a GPT
// whose stage-0 state alone does not fit 4 times in the limit: at --zero 0 every worker refuses it
// before allocating (exit 5, naming the cgroup's limit and the smallest --zero that fits), and at
// --zero 3 the job trains, its peak (memory.max_usage_in_bytes / memory.peak) under the limit. The
// figures come from train::zeroStateBytes, checked first so that the margins are clear: 4 times
// stage 0's state is above the limit, 4 times stage 3's (or its placement's peak) below 60% of it.
// Each run has a fresh cgroup, removed afterwards. Needs root and a writable memory cgroup; skips
// elsewhere, saying why (scripts/test counts and prints the skip).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "nn/model_spec.h"
#include "tests/cli/cli_test_support.h"
#include "tests/support/memory_cgroup.h"
#include "train/zero_memory.h"

namespace cohort::testing {
namespace {

// 9.55M parameters: 145.7 MiB of stage-0 state per worker, 36.4 MiB at stage 3 over 4 workers.
constexpr char kModel[] = "gpt:layers=12,heads=4,dim=256,ctx=32,vocab=256";
constexpr int kWorkers = 4;
constexpr size_t kLimit = size_t{512} << 20;

double mib(size_t bytes) { return static_cast<double>(bytes) / double(1 << 20); }

class ZeroCgroupCliTest : public ShmDirTest {
 protected:
  void SetUp() override {
    ShmDirTest::SetUp();
    std::string text;  // 2000 bytes: a test split of 200, so that the evaluation is one small pass
    for (int i = 0; i < 2000; ++i) text += static_cast<char>('a' + (i * 7 + i / 13) % 9);
    writeFile(dir_ + "/text.txt", text);
  }

  // The job at --zero `zero` inside `cgroup` (a shell moves itself in, then execs cohortrun).
  CommandResult trainIn(const ScopedMemoryCgroup& cgroup, int zero) {
    return runCommand({"/bin/sh", "-c", "echo $$ > \"$0\" || exit 97; exec \"$@\"", cgroup.procsFile(),
                       runfile("launcher/cohortrun"), "--nproc-per-node", std::to_string(kWorkers), "--",
                       cohortBinary(), "train", "--data", "text:" + dir_ + "/text.txt", "--model", kModel,
                       "--optimizer", "adamw", "--batch-size", "1", "--max-steps", "2", "--threads", "1", "--mode",
                       "allreduce", "--replicas", "--zero", std::to_string(zero), "--progress-every", "0"},
                      {.timeout = std::chrono::seconds(180)});
  }
};

TEST_F(ZeroCgroupCliTest, StageZeroIsRefusedBeforeAllocatingAndStageThreeTrains) {
  std::vector<size_t> units;
  for (const auto& u : nn::buildModel(kModel)->params.units()) units.push_back(u.numel);
  const train::ZeroMemoryOptions adamw{.units = units, .groupSize = kWorkers,
                                       .optimizer = {.kind = nn::OptimizerKind::kAdamW}};
  train::ZeroMemoryOptions stage3 = adamw;
  stage3.stage = 3;
  const size_t state0 = train::zeroStateBytes(adamw).total();
  const size_t state3 = std::max(train::zeroStateBytes(stage3).total(), train::zeroPlacementPeakBytes(stage3));
  std::printf("per worker: stage 0's state %.1f MiB, stage 3's %.1f MiB (or its placement's peak); %d workers: %.1f "
              "and %.1f MiB against a limit of %.1f MiB\n",
              mib(state0), mib(state3), kWorkers, mib(kWorkers * state0), mib(kWorkers * state3), mib(kLimit));
  ASSERT_GT(kWorkers * state0, kLimit) << "stage 0 must not fit";
  ASSERT_LT(kWorkers * state3, kLimit * 3 / 5) << "stage 3 must fit with room for the workers themselves";

  const std::string name = "cohort-zero-cgroup-test-" + std::to_string(::getpid());
  {
    ScopedMemoryCgroup cgroup(name + "-zero0", kLimit);
    if (!cgroup.reason().empty()) GTEST_SKIP() << cgroup.reason();
    const CommandResult r = trainIn(cgroup, 0);
    EXPECT_EQ(r.exitCode, 5) << r.describe();
    EXPECT_NE(r.stderrText.find("more than the 4 worker(s) of this node can have"), std::string::npos) << r.describe();
    EXPECT_NE(r.stderrText.find("(the cgroup limit of " + cgroup.directory() + ": 0.5 GiB"), std::string::npos)
        << "the refusal names the cgroup's limit\n" << r.describe();
    std::smatch hint;
    EXPECT_TRUE(std::regex_search(r.stderrText, hint, std::regex("--zero [123] would fit \\([0-9.]+ MiB per worker\\)")))
        << r.describe();
    const std::optional<size_t> peak = cgroup.peakBytes();
    ASSERT_TRUE(peak.has_value()) << "no peak in " << cgroup.directory();
    std::printf("--zero 0: exit %d, '%s'; the cgroup's peak %.1f MiB\n", r.exitCode, hint.str().c_str(), mib(*peak));
    // Refused before the model's state was allocated: less than one worker's parameters.
    EXPECT_LT(*peak, train::zeroStateBytes(adamw).params) << "the refusal came after allocating";
  }
  {
    ScopedMemoryCgroup cgroup(name + "-zero3", kLimit);
    if (!cgroup.reason().empty()) GTEST_SKIP() << cgroup.reason();
    const CommandResult r = trainIn(cgroup, 3);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    EXPECT_EQ(parseResultLine(r.stdoutText).fields["stopped"], "max_steps") << r.stdoutText;
    const std::optional<size_t> peak = cgroup.peakBytes();
    ASSERT_TRUE(peak.has_value()) << "no peak in " << cgroup.directory();
    std::printf("--zero 3: exit %d; the cgroup's peak %.1f MiB of its limit %.1f MiB\n", r.exitCode, mib(*peak),
                mib(kLimit));
    EXPECT_LT(*peak, kLimit);
  }
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

}  // namespace
}  // namespace cohort::testing
