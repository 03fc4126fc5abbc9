// --trace and --step-report end to end (issue 18): the merged trace is valid JSON with every rank's
// spans on one clock, each bucket's all-reduce lies within its step and the ranks' spans of a step
// overlap (cohortrun and mpirun); a worker slowed on purpose (COHORT_TEST_SLOW_BACKWARD) is named
// the slowest rank, with the barrier wait on the other; a trace nobody can write fails at start-up.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_test_support.h"
#include "tests/support/process.h"

namespace cohort::testing {
namespace {

using nlohmann::json;

std::vector<std::string> trainArgs(const std::vector<std::string>& extra, const std::string& model = "mlp:784,64,10",
                                   const std::string& epochs = "1") {
  std::vector<std::string> a = {cohortBinary(), "train", "--data", "synthetic", "--model", model,
                                "--threads", "1", "--epochs", epochs, "--batch-size", "32"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

struct Extent {
  double start = std::numeric_limits<double>::infinity();
  double end = -std::numeric_limits<double>::infinity();
};

// The spans of a trace: per (rank, step), from the first forward's start to the step span's end,
// and every bucket all-reduce.
struct Trace {
  json j;
  std::map<std::pair<int, int>, Extent> steps;
  std::vector<json> buckets;
  std::map<int, std::map<std::string, double>> totalUs;  // rank -> span name -> summed duration

  explicit Trace(const std::string& path) {
    std::ifstream in(path);
    EXPECT_TRUE(in.good()) << path;
    j = json::parse(in);  // throws (fails the test) on invalid JSON
    for (const json& e : j.at("traceEvents")) {
      if (e.at("ph") != "X") continue;
      const int rank = e.at("pid"), step = e.at("args").at("step");
      const double ts = e.at("ts"), dur = e.at("dur");
      EXPECT_GE(dur, 0) << e.dump();
      const std::string cat = e.at("cat");
      totalUs[rank][cat] += dur;
      Extent& x = steps[{rank, step}];
      if (cat == "forward") x.start = std::min(x.start, ts);
      if (cat == "step") x.end = ts + dur;
      if (cat == "allreduce") buckets.push_back(e);
    }
  }
  std::set<int> ranks() const {
    std::set<int> r;
    for (const auto& [key, extent] : steps) r.insert(key.first);
    return r;
  }
};

class TraceCliTest : public ShmDirTest {
 protected:
  void SetUp() override {
    ShmDirTest::SetUp();
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
  CommandResult run(std::vector<std::string> launcher, const std::vector<std::string>& worker,
                    std::vector<std::string> env = {}) {
    launcher.insert(launcher.end(), worker.begin(), worker.end());
    return runCommand(launcher, {.timeout = std::chrono::seconds(240), .extraEnvironment = std::move(env)});
  }
  std::vector<std::string> cohortrun(int n) { return {runfile("launcher/cohortrun"), "--nproc-per-node", std::to_string(n), "--"}; }
  std::vector<std::string> mpirun(int n) {
    return {"/usr/bin/mpirun", "--oversubscribe", "-x", "COHORT_SHM_DIR", "-np", std::to_string(n)};
  }

  // Two ranks training in lockstep: both rows, every bucket inside its step, the ranks' steps overlap.
  void expectOneTimeline(const std::string& path, size_t minBuckets) {
    Trace t(path);
    ASSERT_EQ(t.ranks(), (std::set<int>{0, 1}));
    const json& bounds = t.j.at("otherData").at("clock_error_bound_us");
    ASSERT_EQ(bounds.size(), 2u);
    EXPECT_EQ(bounds[0], 0);
    EXPECT_GE(bounds[1].get<double>(), 0);
    EXPECT_LT(bounds[1].get<double>(), 5000) << "the clocks of two processes on one node, measured over a collective";
    EXPECT_GE(t.buckets.size(), minBuckets);
    const double slack = 0.01;  // us: the file's rounding
    for (const json& b : t.buckets) {
      const Extent& x = t.steps.at({b.at("pid").get<int>(), b.at("args").at("step").get<int>()});
      const double ts = b.at("ts"), end = ts + b.at("dur").get<double>();
      EXPECT_GE(ts + slack, x.start) << b.dump();
      EXPECT_LE(end, x.end + slack) << b.dump();
    }
    int compared = 0;
    for (const auto& [key, x0] : t.steps) {
      if (key.first != 0 || !std::isfinite(x0.start) || !std::isfinite(x0.end)) continue;
      auto other = t.steps.find({1, key.second});
      ASSERT_NE(other, t.steps.end()) << "step " << key.second << " has no spans on rank 1";
      const Extent& x1 = other->second;
      EXPECT_LE(std::max(x0.start, x1.start), std::min(x0.end, x1.end))
          << "step " << key.second << ": rank 0 [" << x0.start << ", " << x0.end << "] and rank 1 [" << x1.start
          << ", " << x1.end << "] do not overlap on the common clock";
      ++compared;
    }
    EXPECT_GE(compared, 60);  // --max-steps 63
  }
};

// Rank 1's clock reads an hour ahead, as another node's might: the measured offset undoes it.
TEST_F(TraceCliTest, ReplicasUnderCohortrunGiveOneTimelineWithBucketsInsideTheirSteps) {
  const std::string trace = dir_ + "/trace.json";
  // Two buckets: the first bucket holds up to 1 MiB (the last layers), the rest another.
  CommandResult r = run(cohortrun(2), trainArgs({"--mode", "allreduce", "--replicas", "--max-steps", "63", "--trace", trace},
                                                "mlp:784,512,10"),
                        {"COHORT_TEST_CLOCK_SKEW=1:3600"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  expectOneTimeline(trace, 2 * 2 * 62);
  EXPECT_NEAR(Trace(trace).j.at("otherData").at("clock_offset_us")[1].get<double>(), 3600e6, 5000);
  EXPECT_NE(r.stdoutText.find("time per step"), std::string::npos) << "--trace turns the step report on";
}

TEST_F(TraceCliTest, MpiRanksUnderMpirunGiveOneTimeline) {
  const std::string trace = dir_ + "/trace.json";
  CommandResult r = run(mpirun(2), trainArgs({"--mode", "allreduce", "--backend", "mpi", "--max-steps", "63",
                                              "--trace", trace}));
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  expectOneTimeline(trace, 2 * 62);
}

// Two processes started by hand with srun's variables (as cli_allreduce_test does), the default shm
// allreduce: the same one timeline.
TEST_F(TraceCliTest, SlurmRanksGiveOneTimeline) {
  const std::string trace = dir_ + "/trace.json";
  std::string quoted;
  for (const auto& a : trainArgs({"--mode", "allreduce", "--max-steps", "63", "--trace", trace})) quoted += " '" + a + "'";
  const std::string slurm = "for r in 0 1; do SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_LOCALID=$r SLURM_TASKS_PER_NODE=2 "
                            "SLURM_JOB_ID=4343$$ " + quoted + " > '" + dir_ + "/slurm.'$r 2>&1 & done; wait; cat '" +
                            dir_ + "/slurm.0' '" + dir_ + "/slurm.1'";
  CommandResult r = runCommand({"/bin/sh", "-c", slurm}, {.timeout = std::chrono::seconds(240)});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.stdoutText.find("from slurm variables"), std::string::npos) << r.stdoutText;
  expectOneTimeline(trace, 0);  // sharded: no buckets, the shard's reduce inside the step
  Trace t(trace);
  EXPECT_GT(t.totalUs[0]["reduce"], 0);
  EXPECT_GT(t.totalUs[1]["reduce"], 0);
}

// The default allreduce (shm, sharded): rank 1 sleeps 50 ms in every backward. The sleep dwarfs a
// step's work (about 1 ms on a quiet machine, 18 ms seen with every core loaded, where a 20 ms sleep
// left a margin of 0.44): the bounds below hold while a step's work stays under 50 ms.
TEST_F(TraceCliTest, ASlowedWorkerIsNamedWithTheBarrierWaitOnTheOther) {
  const std::string trace = dir_ + "/trace.json", metrics = dir_ + "/m.jsonl";
  constexpr int kSleepMs = 50, kSteps = 20;
  CommandResult r = run(cohortrun(2),
                        trainArgs({"--mode", "allreduce", "--max-steps", std::to_string(kSteps), "--trace", trace,
                                   "--metrics", metrics}),
                        {"COHORT_TEST_SLOW_BACKWARD=1:" + std::to_string(kSleepMs)});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.stdoutText.find("slowest rank 1: "), std::string::npos) << r.stdoutText;
  const std::string line = readFile(metrics);
  EXPECT_EQ(jsonNumber(line, "slowest_rank"), 1) << line;
  EXPECT_GT(jsonNumber(line, "slowest_margin"), 0.5) << line;
  EXPECT_GT(jsonNumber(line, "others_barrier_ms"), kSleepMs / 2) << line;
  EXPECT_GT(jsonNumber(line, "step_ms"), kSleepMs) << line;
  Trace t(trace);
  EXPECT_GT(t.totalUs[0]["barrier"], kSteps * kSleepMs / 2 * 1000.0) << "rank 0 waits for rank 1's sleep in every step";
  EXPECT_GT(t.totalUs[1]["backward"], kSteps * kSleepMs * 1000.0);
  EXPECT_LT(t.totalUs[1]["barrier"], t.totalUs[0]["barrier"] / 4);
}

TEST_F(TraceCliTest, ALocalRunHasOneRankAndEveryKindOfSpan) {
  const std::string trace = dir_ + "/trace.json", checkpoint = dir_ + "/run.st";
  CommandResult r = runCommand(trainArgs({"--trace", trace, "--checkpoint", checkpoint}, "mlp:784,64,10", "2"));
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  Trace t(trace);
  EXPECT_EQ(t.ranks(), std::set<int>{0});
  for (const char* kind : {"data", "forward", "backward", "step", "optimizer", "evaluate", "checkpoint"}) {
    EXPECT_GT(t.totalUs[0][kind], 0) << kind;
  }
  EXPECT_NE(r.stdoutText.find("time per step"), std::string::npos);
  EXPECT_EQ(r.stdoutText.find("slowest rank"), std::string::npos) << "one rank has no slowest";
}

// Its directory cannot be made (a file is in the way; a missing one would be made, as for every output).
TEST_F(TraceCliTest, ATraceThatCannotBeWrittenFailsBeforeTraining) {
  writeFile(dir_ + "/no", "a file, not a directory");
  CommandResult r = runCommand(trainArgs({"--trace", dir_ + "/no/such/dir/trace.json"}));
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find("no/such/dir/trace.json: cannot create directory " + dir_ + "/no: a file is there"),
            std::string::npos)
      << r.stderrText;
  EXPECT_EQ(r.stdoutText.find("epoch 1/"), std::string::npos) << "nothing was trained";
}

}  // namespace
}  // namespace cohort::testing
