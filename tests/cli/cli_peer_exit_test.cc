// Ranks that leave a job early, and jobs that share an id (issue 33), with the real `cohort train`:
// - under cohortrun, a rank that exits 0 at once fails the job at once, named (exit 4), instead of
//   leaving rank 0 to wait the whole --timeout;
// - a rank that fails or is killed before the settings agreement is named by its peers within
//   seconds (exit 4), not after the --timeout (60 s here);
// - a second job started with the same job id while the first runs is refused (exit 2) naming the
//   first's process, its host and the id, and the first is not disturbed; an id is reusable after
//   a crash.
// Ranks are started by hand with cohortrun's variables where nothing but the workers themselves
// may notice (as under a user's own launcher), as children whose output is read as they run.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ipc/rank_roster.h"
#include "tests/cli/cli_test_support.h"
#include "tests/launcher/launcher_test_support.h"

namespace cohort::testing {
namespace {

using launcher::testing::Child;
using launcher::testing::Output;
using Clock = std::chrono::steady_clock;
using std::chrono::seconds;

std::string hostName() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::vector<std::string> train(const std::vector<std::string>& extra = {}, const std::string& data = "synthetic",
                               const std::string& model = "mlp:784,32,10") {
  std::vector<std::string> a = {cohortBinary(), "train",    "--mode", "allreduce", "--data", data,        "--model",
                                model,          "--epochs", "1",      "--threads", "1",      "--timeout", "60"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

class PeerExitTest : public ShmDirTest {
 protected:
  // Rank `rank` of a job of `ranks` with id `job`, started by hand.
  Child startRank(const std::string& job, int rank, int ranks, const std::vector<std::string>& argv,
                  const std::vector<std::string>& env = {}) {
    std::vector<std::string> e = {"RANK=" + std::to_string(rank),
                                  "LOCAL_RANK=" + std::to_string(rank),
                                  "WORLD_SIZE=" + std::to_string(ranks),
                                  "LOCAL_WORLD_SIZE=" + std::to_string(ranks),
                                  "COHORT_JOB_ID=" + job,
                                  "COHORT_SHM_DIR=" + shm_};
    e.insert(e.end(), env.begin(), env.end());
    return Child::start(argv, e);
  }
  // Both ranks of a job that trains until stopped (SIGUSR1), its rank 0 slowed so that it outlasts
  // what the test does meanwhile; returns once it is past its settings agreement.
  std::vector<Child> startRunningJob(const std::string& id) {
    const std::vector<std::string> slow = {"COHORT_TEST_SLOW_BACKWARD=0:50"};
    std::vector<Child> ranks;
    for (int r = 0; r < 2; ++r) ranks.push_back(startRank(id, r, 2, train(), slow));
    EXPECT_TRUE(ranks[0].readUntil([](const Output& o) { return contains(o.out, "cohort train: "); }, seconds(60)))
        << "the job did not get past its agreement";
    return ranks;
  }
  // Polls the job's roster (every millisecond, up to 30 s) until local rank `rank` has joined.
  static pid_t awaitJoined(const std::string& job, int rank) {
    const auto deadline = Clock::now() + seconds(30);
    while (Clock::now() < deadline) {
      for (const ipc::RosterEntry& e : ipc::RankRoster::peek(job)) {
        if (e.localRank == rank && e.state == ipc::RosterState::kJoined) return e.pid;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ADD_FAILURE() << "rank " << rank << " of job " << job << " did not join within 30 s";
    return -1;
  }
  // Polls (every millisecond, up to 30 s) until the job's roster has no name: every rank joined.
  static void awaitRosterGone(const std::string& job) {
    const auto deadline = Clock::now() + seconds(30);
    while (!ipc::RankRoster::peek(job).empty()) {
      if (Clock::now() > deadline) {
        ADD_FAILURE() << "the roster of job " << job << " still has its name after 30 s";
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  // `rank` failed on its own, quickly, naming rank `dead` (pid) as having `left` ("exited" or
  // "failed") before the job finished.
  void expectNamed(const Output& r, int rank, int dead, pid_t pid, const std::string& left, double took) {
    EXPECT_EQ(r.exitCode, 4) << r.describe();
    const std::string want = "rank " + std::to_string(dead) + " (pid " + std::to_string(pid) + " on " + hostName() +
                             ") " + left + " before the job finished, while rank " + std::to_string(rank) +
                             " waited at agreement 'settings-0'";
    EXPECT_TRUE(contains(r.err, want)) << "want: " << want << "\n" << r.describe();
    EXPECT_FALSE(contains(r.out, "RESULT")) << r.describe();
    EXPECT_LT(took, 15.0) << "the timeout is 60 s: the peer's death must be noticed, not waited out";
  }
  std::string job(const std::string& what) {
    return what + "-" + std::to_string(::getpid()) + "-" + std::to_string(runs_++);
  }

  int runs_ = 0;
};

// Item 18: a worker that exits 0 at once under cohortrun.
TEST_F(PeerExitTest, UnderCohortrunARankThatExitsZeroAtOnceFailsTheJobNamingIt) {
  std::string script = "if [ \"$RANK\" = 1 ]; then exit 0; fi; exec";
  for (const std::string& a : train()) script += " '" + a + "'";
  const auto start = Clock::now();
  CommandResult r = runCommand(
      {runfile("launcher/cohortrun"), "--nproc-per-node", "2", "--grace-period", "30", "--", "/bin/sh", "-c", script},
      {.timeout = seconds(120)});
  const double took = secondsSince(start);
  EXPECT_EQ(r.exitCode, 4) << r.describe();
  EXPECT_TRUE(contains(r.stderrText, "cohortrun: rank 1 (pid ")) << r.describe();
  EXPECT_TRUE(contains(r.stderrText, ") exited with code 0 before the job finished\n")) << r.describe();
  EXPECT_FALSE(contains(r.stdoutText, "RESULT")) << r.describe();
  EXPECT_LT(took, 20.0) << "rank 0 must not wait the whole --timeout (60 s) for rank 1";
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

// Item 3: a rank that fails (exit 2: its --init-from is no weights file) after making its Job but
// before the settings agreement.
TEST_F(PeerExitTest, ARankThatFailsBeforeTheAgreementIsNamedByItsPeerAtOnce) {
  const std::string id = job("fails"), bad = dir_ + "/not-weights.bin";
  writeFile(bad, "these are not weights\n");
  Child rank0 = startRank(id, 0, 2, train());
  ASSERT_GT(awaitJoined(id, 0), 0) << rank0.output().describe();
  const auto start = Clock::now();
  Child rank1 = startRank(id, 1, 2, train({"--init-from", bad}));
  const Output& r1 = rank1.finish(seconds(90));
  EXPECT_EQ(r1.exitCode, 2) << r1.describe();
  const Output& r0 = rank0.finish(seconds(90));
  expectNamed(r0, 0, 1, rank1.pid(), "failed", secondsSince(start));
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

// Item 3: a rank SIGKILLed after making its Job, while it reads its (large) data set, before the
// agreement; both other ranks name it.
TEST_F(PeerExitTest, ARankKilledBeforeTheAgreementIsNamedByEveryPeerAtOnce) {
  const std::string id = job("killed"), csv = dir_ + "/big.csv";
  {
    std::ofstream out(csv);
    for (int i = 0; i < 400000; ++i) out << i % 7 << ",0.25,0.5,0.75,1.0,0.125,0.375,0.625,0.875,1\n";
  }
  Child rank0 = startRank(id, 0, 3, train());
  Child rank2 = startRank(id, 2, 3, train());
  ASSERT_GT(awaitJoined(id, 0), 0);
  ASSERT_GT(awaitJoined(id, 2), 0);
  Child rank1 = startRank(id, 1, 3, train({"--loss", "mse"}, "csv:" + csv, "mlp:9,1"));
  awaitRosterGone(id);  // the last rank joined: the roster's name goes (docs/ipc.md)
  ASSERT_EQ(::kill(rank1.pid(), SIGKILL), 0);
  const auto start = Clock::now();
  EXPECT_EQ(rank1.finish(seconds(30)).signal, SIGKILL);
  const Output& r0 = rank0.finish(seconds(90));
  expectNamed(r0, 0, 1, rank1.pid(), "exited", secondsSince(start));
  const Output& r2 = rank2.finish(seconds(90));
  expectNamed(r2, 2, 1, rank1.pid(), "exited", secondsSince(start));
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

// Item 19: a second job with the same COHORT_JOB_ID while the first runs.
TEST_F(PeerExitTest, ASecondJobWithTheSameIdIsRefusedNamingTheFirst) {
  const std::string id = job("twice");
  std::vector<Child> first = startRunningJob(id);
  Child second0 = startRank(id, 0, 2, train());
  Child second1 = startRank(id, 1, 2, train());
  const Output& s0 = second0.finish(seconds(60));
  const Output& s1 = second1.finish(seconds(60));
  int rank = 0;
  for (const Output* s : {&s0, &s1}) {
    EXPECT_EQ(s->exitCode, 2) << s->describe();
    const std::string want = "rank " + std::to_string(rank) + " of job COHORT_JOB_ID=" + id + " on " + hostName() +
                             " is already held by process " + std::to_string(first[static_cast<size_t>(rank)].pid()) +
                             ", which is still running: two jobs were started with the same job id";
    EXPECT_TRUE(contains(s->err, want)) << "want: " << want << "\n" << s->describe();
    EXPECT_FALSE(contains(s->out, "RESULT")) << s->describe();
    ++rank;
  }
  // The first job was not disturbed: it stops when asked, cleanly.
  for (Child& c : first) ASSERT_EQ(::kill(c.pid(), SIGUSR1), 0);
  for (Child& c : first) EXPECT_EQ(c.finish(seconds(60)).exitCode, 0) << c.output().describe();
  EXPECT_TRUE(contains(first[0].output().out, "stopped=signal")) << first[0].output().describe();
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

// Item 19: the holder of a rank that crashed does not block the next job of that id.
TEST_F(PeerExitTest, AJobIdIsReusableAfterAJobOfThatIdCrashed) {
  const std::string id = job("reuse");
  std::vector<Child> crashed = startRunningJob(id);
  for (Child& c : crashed) ::kill(c.pid(), SIGKILL);
  for (Child& c : crashed) c.finish(seconds(30));
  Child again0 = startRank(id, 0, 2, train({"--max-steps", "3"}));
  Child again1 = startRank(id, 1, 2, train({"--max-steps", "3"}));
  const Output& a0 = again0.finish(seconds(90));
  const Output& a1 = again1.finish(seconds(90));
  EXPECT_EQ(a0.exitCode, 0) << a0.describe();
  EXPECT_EQ(a1.exitCode, 0) << a1.describe();
  EXPECT_TRUE(contains(a0.out, "RESULT")) << a0.describe();
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

}  // namespace
}  // namespace cohort::testing
