// ClusterTest: the fixture of the tests on the simulated cluster (scripts/cluster, docs/cluster.md).
// SetUp gives the test a directory on the host's file system (under TEST_TMPDIR, which every node
// shares), the path of scripts/cluster and an environment naming a cluster of this test's own
// (COHORT_CLUSTER_NAME: per process and per test, so it never meets another run's names, state or
// lock); it skips, saying why, only where `scripts/cluster check` says the machine cannot run one
// (exit 77). TearDown takes that cluster down (`run` does so itself, except when it is killed at
// a timeout), so nothing is left behind.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "tests/support/process.h"

namespace cohort::testing {

class ClusterTest : public ::testing::Test {
 protected:
  // `prefix`: the first letters of the cluster's name (its namespaces are named after it).
  explicit ClusterTest(std::string prefix) : prefix_(std::move(prefix)) {}

  void SetUp() override;
  void TearDown() override;

  // scripts/cluster ARGS... with this test's cluster.
  CommandResult cluster(const std::vector<std::string>& args, std::chrono::seconds timeout = std::chrono::seconds(30));

  std::string dir_, cluster_;
  std::vector<std::string> env_;

 private:
  std::string prefix_;
};

}  // namespace cohort::testing
