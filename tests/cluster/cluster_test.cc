#include "tests/cluster/cluster_test.h"

#include <unistd.h>

#include <functional>

#include "tests/cli/cli_test_support.h"

namespace cohort::testing {

void ClusterTest::SetUp() {
  dir_ = freshTempDir();
  cluster_ = runfile("scripts/cluster");
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  env_ = {"COHORT_CLUSTER_NAME=" + prefix_ + std::to_string(::getpid() % 100000) + "-" +
          std::to_string(std::hash<std::string>{}(test) % 1000)};
  CommandResult check = cluster({"check"});
  if (check.exitCode == 77) GTEST_SKIP() << "no simulated cluster on this machine: " << check.stdoutText << check.stderrText;
  ASSERT_EQ(check.exitCode, 0) << check.describe();
}

void ClusterTest::TearDown() {
  if (!cluster_.empty()) cluster({"down"}, std::chrono::seconds(60));
}

CommandResult ClusterTest::cluster(const std::vector<std::string>& args, std::chrono::seconds timeout) {
  std::vector<std::string> argv = {cluster_};
  argv.insert(argv.end(), args.begin(), args.end());
  return runCommand(argv, {.timeout = timeout, .workingDirectory = "", .extraEnvironment = env_});
}

}  // namespace cohort::testing
