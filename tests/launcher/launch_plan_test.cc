// LaunchPlan: flag validation and the exact environment of each worker.
#include "launcher/launch_plan.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "runtime/error.h"

namespace cohort::launcher {
namespace {

LaunchFlags validFlags() {
  LaunchFlags f;
  f.nprocPerNode = 4;
  f.command = {"prog", "--x"};
  return f;
}

std::string valueOf(const std::vector<std::string>& env, const std::string& name) {
  std::string found = "<unset>";
  int count = 0;
  for (const std::string& e : env) {
    if (e.rfind(name + "=", 0) == 0) {
      found = e.substr(name.size() + 1);
      ++count;
    }
  }
  return count > 1 ? "<duplicate>" : found;
}

TEST(LaunchPlan, RejectsBadFlagsAsUsageErrors) {
  auto expectInvalid = [](LaunchFlags f, const std::string& needle) {
    try {
      makeLaunchPlan(f, {.jobId = "j", .environment = {}});
      ADD_FAILURE() << "accepted flags that mention " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_EQ(e.code(), ExitCode::kUsage);
    }
  };
  LaunchFlags f = validFlags();
  f.nprocPerNode = 0;
  expectInvalid(f, "--nproc-per-node");
  f = validFlags();
  f.maxRestarts = -1;
  expectInvalid(f, "--max-restarts");
  f = validFlags();
  f.gracePeriodS = 0;
  expectInvalid(f, "--grace-period");
  f.gracePeriodS = -2;
  expectInvalid(f, "--grace-period");
  f = validFlags();
  f.mpsTimeoutS = 0;
  expectInvalid(f, "--mps-timeout");
  f = validFlags();
  f.command.clear();
  expectInvalid(f, "PROGRAM");
}

// Without `--`, only a worker argument that looks like a flag can be misread (cohortrun_test checks
// the exit code and the message end to end).
TEST(LaunchPlan, ASeparatorIsNeededWhenTheWorkersFlagsCouldBeMisread) {
  LaunchFlags f = validFlags();  // prog --x
  EXPECT_NO_THROW(checkSeparator({"--nproc-per-node", "4", "--", "prog", "--x"}, f));
  f.command = {"cat", "-", "file"};  // "-" is stdin, not a flag
  EXPECT_NO_THROW(checkSeparator({"--nproc-per-node", "4", "cat", "-", "file"}, f));
  f.command = {"python3", "-c", "print('hi')"};
  try {
    checkSeparator({"--nproc-per-node=4", "python3", "-c", "print('hi')"}, f);
    ADD_FAILURE() << "accepted -c without --";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("put -- before the worker program"), std::string::npos) << m;
    EXPECT_NE(m.find("(-c)"), std::string::npos) << m;
    // The suggestion, quoted so that a shell reads it back as given.
    EXPECT_NE(m.find(": cohortrun --nproc-per-node=4 -- python3 -c 'print('\\''hi'\\'')'"), std::string::npos) << m;
  }
}

TEST(LaunchPlan, CopiesFlagsAndRoundsTheGracePeriodUp) {
  LaunchFlags f = validFlags();
  f.maxRestarts = 2;
  f.logDir = "logs";
  f.gracePeriodS = 0.0015;
  LaunchPlan plan = makeLaunchPlan(f, {.jobId = "cr-1-2", .environment = {}});
  EXPECT_EQ(plan.worldSize, 4);
  EXPECT_EQ(plan.maxRestarts, 2);
  EXPECT_EQ(plan.logDir, "logs");
  EXPECT_EQ(plan.gracePeriod.count(), 2);
  EXPECT_EQ(plan.command, f.command);
  EXPECT_EQ(plan.jobId, "cr-1-2");
}

TEST(LaunchPlan, BindsEachWorkerToItsOwnBlockOfCpusWhenThereAreEnough) {
  LaunchFlags f = validFlags();  // 4 workers
  LaunchPlan plan = makeLaunchPlan(f, {.jobId = "j", .environment = {}, .allowedCpus = {0, 1, 2, 3, 4, 5, 6, 7, 9}});
  ASSERT_EQ(plan.cpusOfRank.size(), 4u);
  EXPECT_EQ(plan.cpusOfRank[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(plan.cpusOfRank[3], (std::vector<int>{6, 7}));
  // auto: fewer CPUs than workers -> not bound; none -> never bound; cores -> a usage error.
  EXPECT_TRUE(makeLaunchPlan(f, {.jobId = "j", .environment = {}, .allowedCpus = {0, 1}}).cpusOfRank.empty());
  f.bind = "none";
  EXPECT_TRUE(makeLaunchPlan(f, {.jobId = "j", .environment = {}, .allowedCpus = {0, 1, 2, 3}}).cpusOfRank.empty());
  auto invalid = [](LaunchFlags flags, const std::string& needle) {
    try {
      makeLaunchPlan(flags, {.jobId = "j", .environment = {}, .allowedCpus = {0, 1}});
      ADD_FAILURE() << "accepted --bind " << flags.bind;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  f.bind = "cores";
  invalid(f, "--bind cores needs a CPU per worker");
  f.bind = "sockets";
  invalid(f, "--bind must be auto, cores or none");
  EXPECT_FALSE(allowedCpus().empty());
}

TEST(LaunchPlan, EnvironmentPerRank) {
  LaunchPlan plan = makeLaunchPlan(validFlags(), {.jobId = "cr-7-9", .environment = {"PATH=/bin", "HOME=/h"}});
  for (int rank = 0; rank < 4; ++rank) {
    std::vector<std::string> env = plan.environmentFor(rank, 2);
    EXPECT_EQ(valueOf(env, "RANK"), std::to_string(rank));
    EXPECT_EQ(valueOf(env, "LOCAL_RANK"), std::to_string(rank));
    EXPECT_EQ(valueOf(env, "WORLD_SIZE"), "4");
    EXPECT_EQ(valueOf(env, "LOCAL_WORLD_SIZE"), "4");
    EXPECT_EQ(valueOf(env, "COHORT_JOB_ID"), "cr-7-9");
    EXPECT_EQ(valueOf(env, "COHORT_RESTART_COUNT"), "2");
    EXPECT_EQ(valueOf(env, "OMP_NUM_THREADS"), "1");
    EXPECT_EQ(valueOf(env, "PATH"), "/bin");
    EXPECT_EQ(valueOf(env, "HOME"), "/h");
  }
}

TEST(LaunchPlan, KeepsOmpNumThreadsAndReplacesInheritedRankVariables) {
  LaunchPlan plan = makeLaunchPlan(
      validFlags(),
      {.jobId = "cr-7-9",
       .environment = {"OMP_NUM_THREADS=6", "RANK=9", "WORLD_SIZE=17", "LOCAL_RANK=3", "LOCAL_WORLD_SIZE=5",
                       "COHORT_JOB_ID=old", "COHORT_RESTART_COUNT=4", "COHORT_SHM_DIR=/tmp/x", "RANKING=keep"}});
  std::vector<std::string> env = plan.environmentFor(1, 0);
  EXPECT_EQ(valueOf(env, "OMP_NUM_THREADS"), "6");
  EXPECT_EQ(valueOf(env, "RANK"), "1");
  EXPECT_EQ(valueOf(env, "WORLD_SIZE"), "4");
  EXPECT_EQ(valueOf(env, "LOCAL_RANK"), "1");
  EXPECT_EQ(valueOf(env, "LOCAL_WORLD_SIZE"), "4");
  EXPECT_EQ(valueOf(env, "COHORT_JOB_ID"), "cr-7-9");
  EXPECT_EQ(valueOf(env, "COHORT_RESTART_COUNT"), "0");
  EXPECT_EQ(valueOf(env, "COHORT_SHM_DIR"), "/tmp/x");
  EXPECT_EQ(valueOf(env, "RANKING"), "keep");
}

// --mps: the job's directory is under TMPDIR (or /tmp), and inherited MPS variables never reach a
// worker (the Supervisor adds the job daemon's); without --mps they pass through.
TEST(LaunchPlan, MpsPutsTheJobDirectoryUnderTmpdirAndDropsInheritedMpsVariables) {
  const std::vector<std::string> environment = {"TMPDIR=/scratch", "CUDA_MPS_PIPE_DIRECTORY=/run/mps",
                                                "CUDA_MPS_LOG_DIRECTORY=/var/log/mps"};
  LaunchFlags f = validFlags();
  LaunchPlan plain = makeLaunchPlan(f, {.jobId = "cr-7-9", .environment = environment});
  EXPECT_FALSE(plain.mps);
  EXPECT_EQ(plain.jobDirectory, "/scratch/cohortrun-cr-7-9");
  EXPECT_EQ(valueOf(plain.environmentFor(0, 0), "CUDA_MPS_PIPE_DIRECTORY"), "/run/mps");
  f.mps = true;
  f.mpsTimeoutS = 2.5;
  LaunchPlan mps = makeLaunchPlan(f, {.jobId = "cr-7-9", .environment = environment, .mpsNote = "note: x"});
  EXPECT_TRUE(mps.mps);
  EXPECT_EQ(mps.mpsTimeout.count(), 2500);
  EXPECT_EQ(mps.mpsNote, "note: x");
  EXPECT_EQ(valueOf(mps.environmentFor(0, 0), "CUDA_MPS_PIPE_DIRECTORY"), "<unset>");
  EXPECT_EQ(valueOf(mps.environmentFor(0, 0), "CUDA_MPS_LOG_DIRECTORY"), "<unset>");
  EXPECT_EQ(valueOf(mps.environmentFor(0, 0), "TMPDIR"), "/scratch");
  EXPECT_EQ(makeLaunchPlan(f, {.jobId = "cr-1-2", .environment = {"TMPDIR="}}).jobDirectory, "/tmp/cohortrun-cr-1-2");
}

// COHORT_PROGRESS=live exactly when cohortrun's stdout is a terminal; the user's plain or off pass
// through; an inherited live (a cohortrun inside a worker) or any other value is replaced.
TEST(LaunchPlan, ProgressIsLiveOnlyWhenTheLauncherIsOnATerminal) {
  auto progressOf = [](bool terminal, std::vector<std::string> environment) {
    LaunchPlan plan = makeLaunchPlan(
        validFlags(),
        {.jobId = "cr-7-9", .environment = std::move(environment), .allowedCpus = {}, .stdoutIsTerminal = terminal});
    EXPECT_EQ(plan.liveStatus, terminal);
    return valueOf(plan.environmentFor(0, 0), "COHORT_PROGRESS");
  };
  EXPECT_EQ(progressOf(true, {"PATH=/bin"}), "live");
  EXPECT_EQ(progressOf(false, {"PATH=/bin"}), "<unset>");
  EXPECT_EQ(progressOf(true, {"COHORT_PROGRESS=plain"}), "plain");
  EXPECT_EQ(progressOf(false, {"COHORT_PROGRESS=plain"}), "plain");
  EXPECT_EQ(progressOf(true, {"COHORT_PROGRESS=off"}), "off");
  EXPECT_EQ(progressOf(false, {"COHORT_PROGRESS=off"}), "off");
  EXPECT_EQ(progressOf(false, {"COHORT_PROGRESS=live"}), "<unset>");
  EXPECT_EQ(progressOf(true, {"COHORT_PROGRESS=live"}), "live");
  EXPECT_EQ(progressOf(true, {"COHORT_PROGRESS=bogus"}), "live");
  EXPECT_EQ(progressOf(false, {"COHORT_PROGRESS=bogus"}), "<unset>");
  LaunchPlan plan =
      makeLaunchPlan(validFlags(), {.jobId = "cr-7-9", .environment = {}, .allowedCpus = {}, .stdoutIsTerminal = true});
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(valueOf(plan.environmentFor(rank, 1), "COHORT_PROGRESS"), "live");
}

}  // namespace
}  // namespace cohort::launcher
