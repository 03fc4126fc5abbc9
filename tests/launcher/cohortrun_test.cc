// cohortrun end to end: the real launcher (//launcher:cohortrun) starts test_worker processes. Each
// test uses a fresh temporary directory as COHORT_SHM_DIR, so segment checks see only its own job.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>

#include "tests/launcher/launcher_test_support.h"

namespace cohort::launcher::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

std::string readWhole(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t countLines(const std::string& text) { return static_cast<size_t>(std::count(text.begin(), text.end(), '\n')); }

class CohortrunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = freshTempDir();
    shmDir_ = dir_ + "/shm";
    ASSERT_EQ(::mkdir(shmDir_.c_str(), 0700), 0);
  }
  std::vector<std::string> env() const { return {"COHORT_SHM_DIR=" + shmDir_}; }
  Output launch(const std::vector<std::string>& launcherArgs, const std::vector<std::string>& workerArgs) {
    std::vector<std::string> args = launcherArgs;
    args.push_back("--");
    args.push_back(testWorker());
    args.insert(args.end(), workerArgs.begin(), workerArgs.end());
    return runLauncher(args, env());
  }
  Child start(const std::vector<std::string>& launcherArgs, const std::vector<std::string>& workerArgs) {
    std::vector<std::string> argv = {cohortrun()};
    argv.insert(argv.end(), launcherArgs.begin(), launcherArgs.end());
    argv.push_back("--");
    argv.push_back(testWorker());
    argv.insert(argv.end(), workerArgs.begin(), workerArgs.end());
    return Child::start(argv, env());
  }
  // Waits until `n` lines of stdout contain `needle`.
  static void awaitLines(Child& child, const std::string& needle, size_t n) {
    child.readUntil([&](const Output& o) { return linesWith(o.out, needle).size() == n; }, seconds(20));
  }
  // Waits until `n` workers have printed their pid.
  static void awaitWorkers(Child& child, size_t n) { awaitLines(child, "] pid ", n); }
  // SIGSTOPs rank `rank` and waits until it is stopped (use under ASSERT_NO_FATAL_FAILURE).
  static void stopRank(const Child& child, int rank) {
    const pid_t pid = pidOfRank(child.output().out, rank);
    ASSERT_GT(pid, 0) << child.output().describe();
    ASSERT_EQ(::kill(pid, SIGSTOP), 0);
    ASSERT_TRUE(waitUntilStopped(pid, seconds(10))) << "rank " << rank << " did not stop";
  }
  static milliseconds elapsedSince(Clock::time_point start) {
    return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  }
  // Sends cohortrun `signal` and collects the rest of its run; `took`: from the signal to its end.
  static const Output& signalAndFinish(Child& child, int signal, milliseconds& took) {
    const auto sent = Clock::now();
    EXPECT_EQ(::kill(child.pid(), signal), 0);
    const Output& r = child.finish(seconds(15));
    took = elapsedSince(sent);
    return r;
  }
  static void expectAllGone(const std::vector<pid_t>& pids) {
    for (pid_t pid : pids) EXPECT_TRUE(processGone(pid)) << "worker pid " << pid << " outlived cohortrun";
  }

  std::string dir_;
  std::string shmDir_;
};

class CohortrunWorldTest : public CohortrunTest, public ::testing::WithParamInterface<int> {};

TEST_P(CohortrunWorldTest, PrefixesEveryLineOnItsStreamAndSetsTheEnvironment) {
  const int n = GetParam();
  const std::string logDir = dir_ + "/logs";
  Output r = launch({"--nproc-per-node", std::to_string(n), "--log-dir", logDir}, {"--print", "3", "--print-env"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.err.find("cohortrun:"), std::string::npos) << r.describe();
  const std::string jobId = printedEnv(r.out, 0, "COHORT_JOB_ID");
  EXPECT_EQ(jobId.rfind("cr-", 0), 0u) << r.describe();
  for (int rank = 0; rank < n; ++rank) {
    const std::string k = std::to_string(rank);
    for (int i = 0; i < 3; ++i) {
      const std::string i_ = std::to_string(i);
      EXPECT_TRUE(contains(r.out, "[rank " + k + "] stdout line " + i_ + " of rank " + k + "\n")) << r.describe();
      EXPECT_TRUE(contains(r.err, "[rank " + k + "] stderr line " + i_ + " of rank " + k + "\n")) << r.describe();
    }
    EXPECT_EQ(printedEnv(r.out, rank, "RANK"), k);
    EXPECT_EQ(printedEnv(r.out, rank, "LOCAL_RANK"), k);
    EXPECT_EQ(printedEnv(r.out, rank, "WORLD_SIZE"), std::to_string(n));
    EXPECT_EQ(printedEnv(r.out, rank, "LOCAL_WORLD_SIZE"), std::to_string(n));
    EXPECT_EQ(printedEnv(r.out, rank, "COHORT_JOB_ID"), jobId);
    EXPECT_EQ(printedEnv(r.out, rank, "COHORT_RESTART_COUNT"), "0");
    EXPECT_EQ(printedEnv(r.out, rank, "OMP_NUM_THREADS"), "1");
    const std::string log = readWhole(logDir + "/rank" + k + ".log");
    EXPECT_TRUE(contains(log, "attempt 1 (COHORT_RESTART_COUNT=0)")) << log;
    EXPECT_TRUE(contains(log, "\nstdout line 2 of rank " + k + "\n")) << log;
    EXPECT_TRUE(contains(log, "\nstderr line 2 of rank " + k + "\n")) << log;
    EXPECT_FALSE(contains(log, "[rank")) << log;
  }
  // Every line carries the prefix of the rank that wrote it, on the stream it was written to.
  for (const std::string& line : linesWith(r.out, "line ")) {
    EXPECT_EQ(line.substr(1, line.find(']') - 1), "rank " + line.substr(line.rfind(' ') + 1)) << line;
    EXPECT_TRUE(contains(line, "] stdout line")) << line;
  }
  EXPECT_EQ(linesWith(r.err, "stdout line").size(), 0u);
  EXPECT_EQ(workerPids(r.out).size(), static_cast<size_t>(n));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CohortrunWorldTest, ::testing::Values(1, 2, 3, 4));

TEST_F(CohortrunTest, KeepsOmpNumThreadsWhenSet) {
  std::vector<std::string> args = {cohortrun(), "--nproc-per-node", "2", "--", testWorker(), "--print-env"};
  Child child = Child::start(args, {"COHORT_SHM_DIR=" + shmDir_, "OMP_NUM_THREADS=7"});
  const Output& r = child.finish(seconds(60));
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(printedEnv(r.out, 0, "OMP_NUM_THREADS"), "7");
  EXPECT_EQ(printedEnv(r.out, 1, "OMP_NUM_THREADS"), "7");
}

TEST_F(CohortrunTest, FindsTheProgramOnPath) {
  Output r = runLauncher({"--nproc-per-node", "2", "--", "true"}, env());
  EXPECT_EQ(r.exitCode, 0) << r.describe();
}

TEST_F(CohortrunTest, SplitsVeryLongLines) {
  Output r = launch({"--nproc-per-node", "1"}, {"--long-line", "40000"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  size_t xs = 0;
  for (const std::string& line : linesWith(r.out, "xxx")) {
    EXPECT_EQ(line.rfind("[rank 0] ", 0), 0u);
    EXPECT_LE(line.size(), 9u + 16384u);
    xs += line.size() - 9;
  }
  EXPECT_EQ(xs, 40000u);
}

TEST_F(CohortrunTest, AFailingWorkerStopsTheJobWithItsExitCode) {
  Output r = launch({"--nproc-per-node", "3"}, {"--create-segment", "--await-peers", "--print-env", "--steps", "10",
                                                "--at-step", "5", "--exit-code", "3", "--rank", "1", "--hang"});
  EXPECT_EQ(r.exitCode, 3) << r.describe();
  std::vector<pid_t> pids = workerPids(r.out);
  ASSERT_EQ(pids.size(), 3u) << r.describe();
  const std::string rank1Pid = std::to_string(pidOfRank(r.out, 1));
  EXPECT_TRUE(contains(r.err, "cohortrun: rank 1 (pid " + rank1Pid + ") exited with code 3\n")) << r.describe();
  // The report ends with rank 1's last lines, up to the one it printed just before failing.
  const size_t report = r.err.find("lines of rank 1:");
  ASSERT_NE(report, std::string::npos) << r.describe();
  EXPECT_TRUE(contains(r.err.substr(report), "    step 4\n")) << r.describe();
  EXPECT_FALSE(contains(r.err.substr(report), "step 5")) << r.describe();
  EXPECT_EQ(linesWith(r.err, "exited with code").size(), 1u) << r.describe();
  expectAllGone(pids);
  const std::string jobId = printedEnv(r.out, 0, "COHORT_JOB_ID");
  EXPECT_TRUE(segmentFiles(shmDir_, jobId).empty()) << r.describe();
  EXPECT_EQ(linesWith(r.out, "segment ").size(), 3u) << r.describe();
}

TEST_F(CohortrunTest, AWorkerKilledBySignalGives128PlusTheSignal) {
  Output r = launch({"--nproc-per-node", "2"}, {"--signal-self", "9", "--rank", "1", "--hang"});
  EXPECT_EQ(r.exitCode, 137) << r.describe();
  EXPECT_TRUE(contains(r.err, "cohortrun: rank 1 (pid ")) << r.describe();
  EXPECT_TRUE(contains(r.err, ") terminated by signal 9 (SIGKILL)\n")) << r.describe();
  expectAllGone(workerPids(r.out));
}

TEST_F(CohortrunTest, WorkersDieWithAKilledLauncherAndTheNextRunSweepsTheirSegments) {
  // Orphaned workers are reparented to this process, which reaps them (see processGone).
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  Child child = start({"--nproc-per-node", "3"}, {"--create-segment", "--print-env", "--hang"});
  awaitLines(child, "] segment ", 3);
  const std::string jobId = printedEnv(child.output().out, 0, "COHORT_JOB_ID");
  ASSERT_EQ(::kill(child.pid(), SIGKILL), 0);
  const Output& killed = child.finish(seconds(10));
  EXPECT_EQ(killed.signal, SIGKILL);
  for (pid_t pid : workerPids(killed.out)) {
    EXPECT_TRUE(waitUntilGone(pid, seconds(2))) << "worker " << pid << " still alive 2 s after cohortrun was killed";
  }
  // The workers' three, and the job's roster (ipc/rank_roster.h) that cohortrun made.
  EXPECT_EQ(segmentFiles(shmDir_, jobId).size(), 4u) << "nobody was left to remove them";

  Output next = launch({"--nproc-per-node", "1"}, {});
  EXPECT_EQ(next.exitCode, 0) << next.describe();
  EXPECT_TRUE(contains(next.err, "cohortrun: removed stale shared-memory segment cohort." + jobId + ".test-0"))
      << next.describe();
  EXPECT_TRUE(segmentFiles(shmDir_, jobId).empty());
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 0), 0);
}

// A worker with a SIGTERM handler (a checkpoint on the way out) runs it only once it is continued:
// without a SIGCONT it would sit stopped for the whole grace period and then be SIGKILLed.
TEST_F(CohortrunTest, AStoppedWorkerIsContinuedSoItActsOnSigtermAtOnce) {
  Child child = start({"--nproc-per-node", "2", "--grace-period", "30"}, {"--report-signal", "--hang"});
  awaitWorkers(child, 2);
  ASSERT_NO_FATAL_FAILURE(stopRank(child, 0));
  const auto failed = Clock::now();
  ASSERT_EQ(::kill(pidOfRank(child.output().out, 1), SIGKILL), 0);  // the failure
  const Output& r = child.finish(seconds(15));
  const milliseconds took = elapsedSince(failed);
  EXPECT_EQ(r.exitCode, 137) << r.describe();
  EXPECT_LT(took.count(), 5000) << "the stopped worker held the job (grace period 30 s)\n" << r.describe();
  EXPECT_TRUE(contains(r.out, "[rank 0] rank 0 got SIGTERM\n")) << r.describe();
  EXPECT_FALSE(contains(r.err, "sending SIGKILL")) << r.describe();
  expectAllGone(workerPids(r.out));
}

TEST_F(CohortrunTest, RestartsTheGroupAfterAFailure) {
  const std::string logDir = dir_ + "/logs";
  Output r = launch({"--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", logDir},
                    {"--fail-first-attempt", "--rank", "1", "--print-env", "--create-segment", "--await-peers"});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_TRUE(contains(r.err, "cohortrun: restarting the group (attempt 2 of 2) after rank 1 exited with code 3\n"))
      << r.describe();
  std::set<std::string> jobIds;
  for (const std::string& line : linesWith(r.out, "env COHORT_JOB_ID=")) jobIds.insert(line.substr(line.find('=') + 1));
  EXPECT_EQ(jobIds.size(), 1u) << r.describe();
  EXPECT_EQ(linesWith(r.out, "env COHORT_RESTART_COUNT=0").size(), 2u) << r.describe();
  EXPECT_EQ(linesWith(r.out, "env COHORT_RESTART_COUNT=1").size(), 2u) << r.describe();
  const std::string log = readWhole(logDir + "/rank1.log");
  EXPECT_TRUE(contains(log, "attempt 1 (COHORT_RESTART_COUNT=0)")) << log;
  EXPECT_TRUE(contains(log, "attempt 2 (COHORT_RESTART_COUNT=1)")) << log;
  EXPECT_LT(log.find("failing on purpose"), log.find("attempt 2")) << log;
  EXPECT_TRUE(segmentFiles(shmDir_, *jobIds.begin()).empty());
  expectAllGone(workerPids(r.out));
}

TEST_F(CohortrunTest, WithoutRestartsTheSameFailureEndsTheJob) {
  Output r = launch({"--nproc-per-node", "2", "--max-restarts", "0"}, {"--fail-first-attempt", "--rank", "1"});
  EXPECT_EQ(r.exitCode, 3) << r.describe();
  EXPECT_FALSE(contains(r.err, "restarting")) << r.describe();
  EXPECT_TRUE(contains(r.err, "rank 1 (pid ")) << r.describe();
}

TEST_F(CohortrunTest, GivesUpWhenEveryAttemptFails) {
  Output r = launch({"--nproc-per-node", "2", "--max-restarts", "2"},
                    {"--steps", "1", "--at-step", "0", "--exit-code", "5", "--rank", "0"});
  EXPECT_EQ(r.exitCode, 5) << r.describe();
  EXPECT_EQ(linesWith(r.err, "restarting the group").size(), 2u) << r.describe();
  EXPECT_TRUE(contains(r.err, "(attempt 3 of 3)")) << r.describe();
}

TEST_F(CohortrunTest, ForwardsSigtermAndSigusr1ThenExits143) {
  Child child = start({"--nproc-per-node", "2"}, {"--report-signal", "--create-segment", "--print-env", "--hang"});
  awaitLines(child, "] segment ", 2);
  const std::string jobId = printedEnv(child.output().out, 0, "COHORT_JOB_ID");
  ASSERT_EQ(::kill(child.pid(), SIGUSR1), 0);
  child.readUntil([](const Output& o) { return linesWith(o.out, "got SIGUSR1").size() == 2; }, seconds(10));
  ASSERT_EQ(::kill(child.pid(), SIGTERM), 0);
  const Output& r = child.finish(seconds(30));
  EXPECT_EQ(r.exitCode, 143) << r.describe();
  EXPECT_TRUE(contains(r.out, "[rank 0] rank 0 got SIGTERM\n")) << r.describe();
  EXPECT_TRUE(contains(r.out, "[rank 1] rank 1 got SIGTERM\n")) << r.describe();
  EXPECT_FALSE(contains(r.err, "exited with code")) << "a forwarded signal is not a worker failure\n" << r.describe();
  expectAllGone(workerPids(r.out));
  EXPECT_TRUE(segmentFiles(shmDir_, jobId).empty()) << r.describe();
}

// A closed terminal: torchrun's answer, SIGTERM to the workers (so they can checkpoint), then 129.
TEST_F(CohortrunTest, SighupStopsTheWorkersWithSigtermThenExits129) {
  Child child = start({"--nproc-per-node", "2", "--grace-period", "30"},
                      {"--report-signal", "--create-segment", "--print-env", "--hang"});
  awaitLines(child, "] segment ", 2);
  const std::string jobId = printedEnv(child.output().out, 0, "COHORT_JOB_ID");
  // A stopped worker must get the SIGTERM at once here too, not SIGKILL after the grace period.
  ASSERT_NO_FATAL_FAILURE(stopRank(child, 1));
  milliseconds took{};
  const Output& r = signalAndFinish(child, SIGHUP, took);
  EXPECT_EQ(r.exitCode, 129) << r.describe();
  EXPECT_LT(took.count(), 5000) << r.describe();
  EXPECT_TRUE(contains(r.out, "[rank 0] rank 0 got SIGTERM\n")) << r.describe();
  EXPECT_TRUE(contains(r.out, "[rank 1] rank 1 got SIGTERM\n")) << r.describe();
  const std::vector<std::string> said = linesWith(r.err, "SIGHUP");
  ASSERT_EQ(said.size(), 1u) << r.describe();
  EXPECT_EQ(said[0].rfind("cohortrun: got SIGHUP; stopping the workers", 0), 0u) << r.describe();
  EXPECT_FALSE(contains(r.err, "exited with code")) << r.describe();
  EXPECT_FALSE(contains(r.err, "sending SIGKILL")) << r.describe();
  expectAllGone(workerPids(r.out));
  EXPECT_TRUE(segmentFiles(shmDir_, jobId).empty()) << r.describe();
}

// Under nohup cohortrun keeps ignoring SIGHUP, as asked; its workers still start with the default
// action, like every signal cohortrun forwards.
TEST_F(CohortrunTest, UnderNohupSighupIsIgnoredAndWorkersStartWithItsDefault) {
  struct sigaction previous {};
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGHUP, &ignore, &previous), 0);
  Child child = start({"--nproc-per-node", "2"}, {"--print-signals", "--hang"});
  ASSERT_EQ(::sigaction(SIGHUP, &previous, nullptr), 0);
  awaitLines(child, "] signal SIGPIPE", 2);
  // An ignored signal is discarded when it is sent, so the SIGTERM below finds no SIGHUP pending.
  ASSERT_EQ(::kill(child.pid(), SIGHUP), 0);
  ASSERT_EQ(::kill(child.pid(), SIGTERM), 0);
  const Output& r = child.finish(seconds(30));
  EXPECT_EQ(r.exitCode, 143) << r.describe();
  for (const char* name : {"SIGHUP", "SIGINT", "SIGTERM", "SIGUSR1", "SIGPIPE"}) {
    const std::string state = std::string("] signal ") + name + ": default, unblocked";
    EXPECT_EQ(linesWith(r.out, state).size(), 2u) << state << "\n" << r.describe();
  }
  expectAllGone(workerPids(r.out));
}

TEST_F(CohortrunTest, SigintExits130) {
  Child child = start({"--nproc-per-node", "2"}, {"--hang"});
  awaitWorkers(child, 2);
  ASSERT_EQ(::kill(child.pid(), SIGINT), 0);
  const Output& r = child.finish(seconds(30));
  EXPECT_EQ(r.exitCode, 130) << r.describe();
  expectAllGone(workerPids(r.out));
}

TEST_F(CohortrunTest, AWorkerIgnoringSigtermIsKilledAfterTheGracePeriod) {
  Child child = start({"--nproc-per-node", "2", "--grace-period", "1"}, {"--ignore-sigterm", "--hang"});
  awaitWorkers(child, 2);
  milliseconds took{};
  const Output& r = signalAndFinish(child, SIGTERM, took);
  EXPECT_EQ(r.exitCode, 143) << r.describe();
  EXPECT_GE(took.count(), 900) << r.describe();
  EXPECT_LT(took.count(), 4000) << r.describe();
  EXPECT_EQ(linesWith(r.err, "sending SIGKILL (--grace-period gives workers longer to checkpoint)").size(), 2u)
      << r.describe();
  expectAllGone(workerPids(r.out));
}

TEST_F(CohortrunTest, UsageErrorsAreOneLineAndExitCode2) {
  const std::string notExecutable = dir_ + "/plain-file";
  std::ofstream(notExecutable) << "data\n";
  const std::string w = testWorker();
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"--nproc-per-node", "0", "--", w}, "--nproc-per-node"},
      {{"--nproc-per-node", "-3", "--", w}, "--nproc-per-node"},
      {{"--nproc-per-node", "two", "--", w}, "--nproc-per-node"},
      {{"--", w}, "--nproc-per-node"},
      {{"--nproc-per-node", "2"}, "missing PROGRAM"},
      {{"--nproc-per-node", "2", "--"}, "missing PROGRAM"},
      {{"--nproc-per-node", "2", "--bogus", "--", w}, "--bogus"},
      {{"--nproc-per-node", "2", "--grace-period", "0", "--", w}, "--grace-period"},
      {{"--nproc-per-node", "2", "--max-restarts", "-1", "--", w}, "--max-restarts"},
      {{"--nproc-per-node", "2", "--log-dir", notExecutable + "/sub", "--", w}, "log directory"},
      {{"--nproc-per-node", "2", "--", "no-such-program-xyz"},
       "cohortrun: error: cannot execute 'no-such-program-xyz': No such file or directory"},
      {{"--nproc-per-node", "2", "--", dir_ + "/missing"}, "cannot execute '" + dir_ + "/missing': No such file"},
      {{"--nproc-per-node", "2", "--", notExecutable}, "cannot execute '" + notExecutable + "': Permission denied"},
  };
  for (const Case& c : cases) {
    Output r = runLauncher(c.args, env());
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_EQ(countLines(r.err), 1u) << r.describe();
    EXPECT_TRUE(contains(r.err, c.needle)) << "expected '" << c.needle << "'\n" << r.describe();
    EXPECT_EQ(r.out, "") << r.describe();
  }
}

// Without `--`, the worker's flags would be read as cohortrun's: CLI11's "arguments were not
// expected" for unknown ones, silently taken for known ones (--log-dir). Both get the hint.
TEST_F(CohortrunTest, AForgottenDoubleDashIsExplained) {
  const std::string w = testWorker();
  const std::vector<std::vector<std::string>> cases = {
      {"--nproc-per-node", "2", w, "--steps", "1"},
      {"--nproc-per-node", "2", w, "--log-dir", dir_ + "/logs"},
      {"--nproc-per-node=2", "--grace-period", "1", w, "x", "--hang"},
  };
  const std::vector<std::string> expected = {
      "cohortrun --nproc-per-node 2 -- " + w + " --steps 1",
      "cohortrun --nproc-per-node 2 -- " + w + " --log-dir " + dir_ + "/logs",
      "cohortrun --nproc-per-node=2 --grace-period 1 -- " + w + " x --hang",
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    Output r = runLauncher(cases[i], env());
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_EQ(countLines(r.err), 1u) << r.describe();
    EXPECT_TRUE(contains(r.err, "cohortrun: error: put -- before the worker program")) << r.describe();
    EXPECT_TRUE(contains(r.err, expected[i] + "\n")) << "expected '" << expected[i] << "'\n" << r.describe();
    EXPECT_EQ(r.out, "") << r.describe();
  }
  // Nothing that looks like a flag follows PROGRAM: nothing to misread, so it runs.
  Output plain = runLauncher({"--nproc-per-node", "2", w}, env());
  EXPECT_EQ(plain.exitCode, 0) << plain.describe();
}

TEST_F(CohortrunTest, HelpGoesToStdoutWithExitCode0) {
  Output r = runLauncher({"--help"}, env());
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  for (const char* flag : {"--nproc-per-node", "--max-restarts", "--log-dir", "--grace-period", "--bind"}) {
    EXPECT_TRUE(contains(r.out, flag)) << flag << "\n" << r.describe();
  }
}

// ---- Rank 0's progress as a status line (docs/launcher.md, "Progress") ----

const std::string kErase = "\r\x1b[K";

// Every "[rank 1] ..." line of `out` whole: from its prefix to its newline no "\r" or escape, and
// it starts a row (the text's start, a newline, or right after the status line's erase).
void expectWholeLinesOfRank1(const std::string& out, size_t expected) {
  size_t lines = 0;
  for (size_t at = out.find("[rank 1] "); at != std::string::npos; at = out.find("[rank 1] ", at + 1)) {
    ++lines;
    const size_t end = out.find('\n', at);
    ASSERT_NE(end, std::string::npos) << "an unterminated line at " << at;
    const std::string line = out.substr(at, end - at);
    EXPECT_EQ(line.find_first_of("\r\x1b"), std::string::npos) << "a garbled line: " << ::testing::PrintToString(line);
    const bool startsRow = at == 0 || out[at - 1] == '\n' ||
                           (at >= kErase.size() && out.compare(at - kErase.size(), kErase.size(), kErase) == 0);
    EXPECT_TRUE(startsRow) << ::testing::PrintToString(out.substr(at >= 20 ? at - 20 : 0, 40));
  }
  EXPECT_EQ(lines, expected);
}

TEST_F(CohortrunTest, OnATerminalRankZerosProgressIsAStatusLineBelowWholeLines) {
  Output r =
      runInTerminal({cohortrun(), "--nproc-per-node", "2", "--", testWorker(), "--print-env", "--progress", "40"},
                    {.extraEnv = env(), .timeout = seconds(60)});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::string& out = r.out;
  EXPECT_NE(out.find("[rank 0] env COHORT_PROGRESS=live\n"), std::string::npos) << r.describe();
  EXPECT_NE(out.find("[rank 1] env COHORT_PROGRESS=live\n"), std::string::npos) << r.describe();
  // Every progress line of rank 0 was drawn as the status line; none of rank 1's, and no marker.
  for (int i = 0; i < 40; ++i) {
    EXPECT_NE(out.find("\r[rank 0] step " + std::to_string(i) + " of 40\x1b[K"), std::string::npos) << i;
  }
  EXPECT_EQ(out.find("[rank 1] step"), std::string::npos);
  EXPECT_EQ(out.find("cohort-progress"), std::string::npos);
  // Both streams of rank 1 (pid, 8 env lines, 40 work, 40 note) arrive whole, however they fall
  // among the redraws; rank 0's ordinary lines too.
  expectWholeLinesOfRank1(out, 1 + 8 + 40 + 40);
  for (int i = 0; i < 40; ++i) {
    EXPECT_NE(out.find("[rank 0] work " + std::to_string(i) + " of rank 0\n"), std::string::npos) << i;
    EXPECT_NE(out.find("[rank 1] note " + std::to_string(i) + " of rank 1\n"), std::string::npos) << i;
  }
  // At the end the status line is erased: the last draw is followed by an erase, and no draw after.
  const size_t lastDraw = out.rfind("\r[rank 0] step ");
  ASSERT_NE(lastDraw, std::string::npos);
  EXPECT_NE(out.find(kErase, lastDraw), std::string::npos) << ::testing::PrintToString(out.substr(lastDraw));
}

TEST_F(CohortrunTest, WithoutATerminalThereIsNoStatusLineAndTheUsersChoiceIsKept) {
  Output piped = launch({"--nproc-per-node", "2"}, {"--print-env", "--progress", "5"});
  ASSERT_EQ(piped.exitCode, 0) << piped.describe();
  EXPECT_EQ(printedEnv(piped.out, 0, "COHORT_PROGRESS"), "<unset>");
  EXPECT_EQ(piped.out.find_first_of("\r\x1b"), std::string::npos) << piped.describe();
  EXPECT_EQ(piped.out.find("step"), std::string::npos) << "progress lines reached a pipe";
  EXPECT_EQ(linesWith(piped.out, "] work ").size(), 10u);

  std::vector<std::string> plainEnv = env();
  plainEnv.push_back("COHORT_PROGRESS=plain");
  Output plain = runInTerminal({cohortrun(), "--nproc-per-node", "2", "--", testWorker(), "--print-env"},
                               {.extraEnv = plainEnv, .timeout = seconds(60)});
  ASSERT_EQ(plain.exitCode, 0) << plain.describe();
  EXPECT_NE(plain.out.find("[rank 0] env COHORT_PROGRESS=plain\n"), std::string::npos) << plain.describe();
  EXPECT_NE(plain.out.find("[rank 1] env COHORT_PROGRESS=plain\n"), std::string::npos) << plain.describe();
  EXPECT_EQ(plain.out.find('\r'), std::string::npos) << plain.describe();
}

}  // namespace
}  // namespace cohort::launcher::testing
