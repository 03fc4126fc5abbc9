// Sharded checkpoints survive kill -9 at any moment (issue 46, item 3): 2 ranks at stage 1 save an
// asynchronous checkpoint after every step (staged, written in the background, committed at a later
// step boundary); the whole job is SIGKILLed at 20 moments picked by seeded random delays (in
// microseconds, after both ranks report a committed checkpoint; the delay picks the moment, it
// synchronises nothing). After each kill the committed checkpoint must read back whole and hold,
// bit for bit, the state an uninterrupted reference run had at the step it records; the next run
// resumes from it (through Job::load, resharded), so every later commit also checks that a resume
// continues exactly as the uninterrupted run.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/model_spec.h"
#include "nn/sharded_checkpoint.h"
#include "tests/ipc/multiproc.h"
#include "tests/train/sharded_run.h"

namespace cohort::train {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kRanks = 2, kSteps = 40, kKills = 20;

// The job's ranks, forked; the parent keeps their pids and the pipe's read end.
struct RunningJob {
  std::vector<pid_t> ranks;
  int reports = -1;
};

RunningJob startJob(const testing::ShardedRun& run) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const std::string jobId = ipc::testing::freshJobId();
  RunningJob job{.reports = fds[0]};
  for (int r = 0; r < kRanks; ++r) {
    const runtime::WorldInfo world{.rank = r, .worldSize = kRanks, .localRank = r, .localWorldSize = kRanks,
                                   .jobId = jobId, .source = "test"};
    testing::ShardedRun mine = run;
    mine.reportFd = fds[1];
    job.ranks.push_back(ipc::testing::forkChild([=] {
      ::close(fds[0]);
      return testing::runShardedRank(mine, world);
    }));
  }
  ::close(fds[1]);
  return job;
}

// Whether every rank reported within the timeout.
bool awaitReports(const RunningJob& job, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (int got = 0; got < kRanks;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{.fd = job.reports, .events = POLLIN, .revents = 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) != 1) return false;
    char c;
    if (::read(job.reports, &c, 1) != 1) return false;
    ++got;
  }
  return true;
}

TEST(ZeroCheckpointKill, TheCommittedCheckpointSurvivesKillNineAndResumesExactly) {
  ipc::testing::ScopedShmDir shm;
  const std::string dir = shm.path(), refDir = dir + "/reference";
  ASSERT_EQ(::mkdir(refDir.c_str(), 0700), 0);
  // The uninterrupted run, its state after every step; its duration bounds the delays.
  RunningJob reference = startJob({.zero = 1, .lastStep = kSteps, .referenceDir = refDir});
  ASSERT_TRUE(awaitReports(reference, std::chrono::seconds(60)));
  const auto start = Clock::now();
  for (pid_t pid : reference.ranks) ASSERT_EQ(ipc::testing::waitChild(pid, std::chrono::seconds(120)), 0);
  ::close(reference.reports);
  const auto maxDelayUs = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count() + 1;

  std::mt19937_64 rng(46);
  int chain = 0, finished = 0, committedSteps = 0;
  for (int kill = 0; kill < kKills; ++kill) {
    const std::string path = dir + "/chain" + std::to_string(chain) + ".ckpt";
    RunningJob job = startJob({.zero = 1, .lastStep = kSteps, .loadFrom = path, .checkpoint = path, .asyncEveryStep = true});
    ASSERT_TRUE(awaitReports(job, std::chrono::seconds(60))) << "kill " << kill;
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % static_cast<uint64_t>(maxDelayUs)));  // the moment
    for (pid_t pid : job.ranks) ::kill(pid, SIGKILL);
    for (pid_t pid : job.ranks) {
      const int status = ipc::testing::waitChild(pid, std::chrono::seconds(60));
      EXPECT_TRUE(status == 0 || status == -SIGKILL) << "kill " << kill << ": " << status;
    }
    ::close(job.reports);
    const nn::Checkpoint committed = testing::readWholeCheckpoint(path);
    const int step = std::stoi(committed.metadata.at("step"));
    testing::expectSameState(committed, testing::readWholeCheckpoint(testing::referencePath(refDir, step)),
                         "kill " + std::to_string(kill) + " at step " + std::to_string(step));
    std::printf("kill %d: committed step %d (generation %llu)\n", kill, step,
                static_cast<unsigned long long>(*nn::committedShardGeneration(path)));
    committedSteps += step;
    if (step == kSteps) {  // the chain trained to its end: the next kill starts a new one
      ++chain;
      ++finished;
    }
  }
  EXPECT_GT(committedSteps, 0) << "every kill came before the first step";
  std::printf("%d kills, %d chains trained to the end\n", kKills, finished);
}

}  // namespace
}  // namespace cohort::train
