// `cohort train --device cuda` end to end (tags = ["gpu"]; skips with the reason when the cohort
// binary sees no CUDA device): the MLP workload reaches the accuracy it reaches on the CPU, the
// memory report and the input wait are printed, and a GPU checkpoint resumes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

class CliGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CommandResult devices = runCohort({"devices"});
    ASSERT_EQ(devices.exitCode, 0) << devices.describe();
    size_t none = devices.stdoutText.find("CUDA devices: 0 (");
    if (none != std::string::npos) {
      GTEST_SKIP() << "no CUDA device: " << devices.stdoutText.substr(none, devices.stdoutText.find('\n', none) - none);
    }
    dir_ = freshTempDir();
  }
  std::string dir_;
};

TEST_F(CliGpuTest, SyntheticMlpReachesTheCpuAccuracy) {
  const std::vector<std::string> common = {"train", "--epochs", "1", "--lr", "0.05", "--momentum", "0.9", "--seed", "0"};
  std::vector<std::string> gpuArgs = common, cpuArgs = common;
  for (const char* a : {"--device", "cuda", "--memory-report"}) gpuArgs.push_back(a);
  CommandResult gpu = runCohort(gpuArgs);
  ASSERT_EQ(gpu.exitCode, 0) << gpu.describe();
  CommandResult cpu = runCohort(cpuArgs);
  ASSERT_EQ(cpu.exitCode, 0) << cpu.describe();
  ResultLine g = parseResultLine(gpu.stdoutText), c = parseResultLine(cpu.stdoutText);
  EXPECT_GE(g.number("test_acc"), 0.72) << gpu.describe();
  EXPECT_NEAR(g.number("test_acc"), c.number("test_acc"), 0.02) << "GPU and CPU runs from the same seed\n" << gpu.describe();
  EXPECT_NE(gpu.stdoutText.find("memory report (cuda:0 caching allocator): allocated"), std::string::npos) << gpu.describe();
  EXPECT_NE(gpu.stdoutText.find("input wait on cuda:0"), std::string::npos) << gpu.describe();
}

TEST_F(CliGpuTest, CheckpointOnGpuResumes) {
  const std::string ckpt = dir_ + "/gpu.st";
  std::vector<std::string> args = {"train", "--device", "cuda", "--epochs", "2", "--momentum", "0.9", "--checkpoint", ckpt};
  std::vector<std::string> first = args;
  for (const char* a : {"--max-steps", "300"}) first.push_back(a);
  CommandResult a = runCohort(first);
  ASSERT_EQ(a.exitCode, 0) << a.describe();
  ASSERT_TRUE(fileExists(ckpt));
  std::vector<std::string> second = args;
  second.push_back("--resume");
  CommandResult b = runCohort(second);
  ASSERT_EQ(b.exitCode, 0) << b.describe();
  EXPECT_NE(b.stdoutText.find("resumed from"), std::string::npos) << b.describe();
  EXPECT_GE(parseResultLine(b.stdoutText).number("test_acc"), 0.72) << b.describe();
}

}  // namespace
}  // namespace cohort::testing
