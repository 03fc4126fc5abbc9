// RankRoster (ipc/rank_roster.h) with forked processes as ranks: claims (a second live claim of a
// rank is refused naming its holder; a stale roster starts afresh), the rendezvous (a peer that
// died or finished before arriving is named at once; a missing one is a timeout listing it), the
// launcher's records, and the name's lifetime (it goes once every rank joined, so killed workers
// leave nothing; the last one out removes it; the sweep removes a stale one and keeps a live one).
#include "ipc/rank_roster.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "ipc/process_liveness.h"
#include "ipc/shm_names.h"
#include "ipc/shm_region.h"
#include "runtime/error.h"
#include "tests/ipc/multiproc.h"

namespace cohort::ipc {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::forkChild;
using testing::freshJobId;
using testing::ScopedShmDir;
using testing::waitChild;

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

RankRoster::JoinOptions rank(const std::string& job, int r, int n) {
  return {.jobId = job, .rank = r, .localRank = r, .localWorldSize = n, .jobIdSource = "COHORT_JOB_ID=" + job};
}

// A child that joins as `r` (and with `abandon` leaves unfinished), says so, and lives until it is
// killed; returns once it has joined.
pid_t holdRank(const std::string& job, int r, int n, bool abandon = false) {
  int ready[2], hold[2];
  if (::pipe(ready) != 0 || ::pipe(hold) != 0) return -1;
  const pid_t pid = forkChild([&] {
    ::close(ready[0]);
    ::close(hold[1]);
    RankRoster roster = RankRoster::join(rank(job, r, n));
    if (abandon) roster.leave(false);
    char c = 'j';
    if (::write(ready[1], &c, 1) != 1) return 1;
    return static_cast<int>(::read(hold[0], &c, 1));  // blocks: the parent keeps the write end
  });
  ::close(ready[1]);
  ::close(hold[0]);
  char c = 0;
  EXPECT_EQ(::read(ready[0], &c, 1), 1) << "the holder did not join";
  ::close(ready[0]);
  return pid;  // hold[1] stays open in this process until it ends
}

// Runs `f` and returns what it threw (empty when nothing), failing the test on another type.
template <class E, class F>
std::string messageOf(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "nothing thrown";
  return "";
}

class RankRosterTest : public ::testing::Test {
 protected:
  std::string path() const { return shm_.privatePath() + "/" + segmentName(job_, "roster"); }
  bool exists() const {
    struct stat st {};
    return ::stat(path().c_str(), &st) == 0;
  }
  ScopedShmDir shm_;
  std::string job_ = freshJobId();
};

TEST_F(RankRosterTest, ASecondLiveClaimOfARankIsRefusedNamingTheHolderHostAndJob) {
  RankRoster mine = RankRoster::join(rank(job_, 0, 2));
  const pid_t other = forkChild([&] {
    const std::string m = messageOf<InvalidArgument>([&] { RankRoster::join(rank(job_, 0, 2)); });
    const std::string want = "rank 0 of job COHORT_JOB_ID=" + job_ + " on " + thisHost() + " is already held by process " +
                             std::to_string(::getppid()) +
                             ", which is still running: two jobs were started with the same job id";
    return contains(m, want) ? 0 : (std::fprintf(stderr, "got: %s\nwant: %s\n", m.c_str(), want.c_str()), 1);
  });
  EXPECT_EQ(waitChild(other), 0);
}

TEST_F(RankRosterTest, AJobOfAnotherSizeWithTheSameIdIsRefused) {
  RankRoster mine = RankRoster::join(rank(job_, 0, 2));
  const pid_t other = forkChild([&] {
    const std::string m = messageOf<InvalidArgument>([&] { RankRoster::join(rank(job_, 1, 3)); });
    return contains(m, "is one of 3 local ranks, but a running job of that id on " + thisHost() + " has 2") ? 0 : 1;
  });
  EXPECT_EQ(waitChild(other), 0);
}

TEST_F(RankRosterTest, ARosterWhoseProcessesAreAllGoneStartsAfresh) {
  // A crashed job: its rank 0 joined and died without leaving; its rank 1 never came.
  EXPECT_EQ(waitChild(forkChild([&] {
              RankRoster::join(rank(job_, 0, 2));
              ::_exit(0);
              return 0;
            })),
            0);
  ASSERT_TRUE(exists());
  // A segment the crashed job left: a rank of the next job must not open it (its creator is gone).
  const std::string left = shm_.privatePath() + "/" + segmentName(job_, "job");
  ::close(::open(left.c_str(), O_CREAT | O_WRONLY, 0600));
  RankRoster again = RankRoster::join(rank(job_, 1, 2));  // the same id, reused
  EXPECT_NE(::access(left.c_str(), F_OK), 0) << "the crashed job's segment went with its roster";
  const auto entries = RankRoster::peek(job_);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].pid, 0) << "the dead job's rank 0 was forgotten";
  EXPECT_EQ(entries[1].pid, ::getpid());
  EXPECT_EQ(entries[1].state, RosterState::kJoined);
}

TEST_F(RankRosterTest, TheFirstRankOfAJobRemovesTheSegmentsACrashedJobOfItsIdLeft) {
  // A crashed job of this id: every rank joined (so its roster's name is gone) and its rank 0 made a
  // segment, then all were killed before the segment's first barrier removed the name.
  const pid_t crashed = forkChild([&] {
    RankRoster roster = RankRoster::join(rank(job_, 0, 1));
    ShmRegion::create({.jobId = job_, .name = "params", .payloadBytes = 64});
    ::_exit(0);
    return 0;
  });
  ASSERT_EQ(waitChild(crashed), 0);
  ASSERT_FALSE(exists());
  const std::string left = shm_.privatePath() + "/" + segmentName(job_, "params");
  ASSERT_EQ(::access(left.c_str(), F_OK), 0);
  // A segment of this id whose creator lives is not this process's to judge: it stays.
  ShmRegion live = ShmRegion::create({.jobId = job_, .name = "live", .payloadBytes = 64});
  RankRoster again = RankRoster::join(rank(job_, 0, 2));
  EXPECT_NE(::access(left.c_str(), F_OK), 0) << "a rank of the new job would have opened it";
  EXPECT_EQ(::access((shm_.privatePath() + "/" + segmentName(job_, "live")).c_str(), F_OK), 0);
}

TEST_F(RankRosterTest, TheRankOfADeadHolderIsRefusedWhileItsJobStillRuns) {
  const pid_t holder = holdRank(job_, 0, 3);  // rank 2 has not joined yet: the name still exists
  ASSERT_GT(holder, 0);
  const pid_t crashed = forkChild([&] {
    RankRoster::join(rank(job_, 1, 3));
    ::_exit(0);
    return 0;
  });
  ASSERT_EQ(waitChild(crashed), 0);
  const std::string m = messageOf<InvalidArgument>([&] { RankRoster::join(rank(job_, 1, 3)); });
  EXPECT_TRUE(contains(m, "was held by process " + std::to_string(crashed) +
                              ", which has exited, but that job still runs here (rank 0 is process " +
                              std::to_string(holder) + ")"))
      << m;
  ::kill(holder, SIGKILL);
  waitChild(holder);
}

TEST_F(RankRosterTest, TheNameGoesOnceEveryRankJoinedAndTheRanksStillMeet) {
  RankRoster mine = RankRoster::join(rank(job_, 0, 2));
  EXPECT_TRUE(exists());
  const pid_t peer = forkChild([&] {
    RankRoster roster = RankRoster::join(rank(job_, 1, 2));
    for (int i = 0; i < 3; ++i) roster.arriveAndWait("round " + std::to_string(i), seconds(30));
    roster.leave(true);
    return 0;
  });
  mine.arriveAndWait("round 0", seconds(30));  // the peer joined before it arrived
  EXPECT_FALSE(exists()) << "the last rank to join removes the name";
  mine.arriveAndWait("round 1", seconds(30));
  mine.arriveAndWait("round 2", seconds(30));
  EXPECT_EQ(waitChild(peer), 0);
  EXPECT_EQ(mine.stateOf(1), RosterState::kFinished) << "the mapping outlives the name";
}

TEST_F(RankRosterTest, WorkersKilledAllAtOnceLeaveNothingBehind) {
  // What mpirun or srun does to a node's workers when the job fails elsewhere.
  const pid_t a = holdRank(job_, 0, 2);
  const pid_t b = holdRank(job_, 1, 2);
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  ::kill(a, SIGKILL);
  ::kill(b, SIGKILL);
  waitChild(a);
  waitChild(b);
  EXPECT_FALSE(exists());
  EXPECT_TRUE(sweepStaleSegments().empty());
}

TEST_F(RankRosterTest, APeerThatDiesBeforeArrivingIsNamedAtOnce) {
  RankRoster mine = RankRoster::join(rank(job_, 0, 2));
  const pid_t peer = forkChild([&] {
    RankRoster::join(rank(job_, 1, 2));
    ::_exit(0);  // exits 0 without ending its job
    return 0;
  });
  ASSERT_EQ(waitChild(peer), 0);
  const auto start = std::chrono::steady_clock::now();
  const std::string m = messageOf<PeerError>([&] { mine.arriveAndWait("agreement 'test'", seconds(60)); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(2));
  EXPECT_TRUE(contains(m, "rank 1 (pid " + std::to_string(peer) + " on " + thisHost() +
                              ") exited before the job finished, while rank 0 waited at agreement 'test'"))
      << m;
}

TEST_F(RankRosterTest, APeerThatFinishedIsNamedAsHavingLeft) {
  RankRoster mine = RankRoster::join(rank(job_, 0, 2));
  const pid_t peer = forkChild([&] {
    RankRoster::join(rank(job_, 1, 2)).leave(true);
    return 0;
  });
  ASSERT_EQ(waitChild(peer), 0);
  const std::string m = messageOf<PeerError>([&] { mine.arriveAndWait("agreement 'test'", seconds(60)); });
  EXPECT_TRUE(contains(m, "rank 1 (pid " + std::to_string(peer) + " on " + thisHost() + ") finished and left the job"))
      << m;
}

TEST_F(RankRosterTest, APeerWhoseJobFailedIsNamedEvenBeforeItsProcessEnds) {
  RankRoster mine = RankRoster::join(rank(job_, 0, 2));
  const pid_t peer = holdRank(job_, 1, 2, /*abandon=*/true);
  ASSERT_GT(peer, 0);
  const std::string m = messageOf<PeerError>([&] { mine.arriveAndWait("agreement 'test'", seconds(60)); });
  EXPECT_TRUE(
      contains(m, "rank 1 (pid " + std::to_string(peer) + " on " + thisHost() + ") failed before the job finished,"))
      << m;
  ::kill(peer, SIGKILL);
  waitChild(peer);
}

TEST_F(RankRosterTest, ARankThatNeverComesIsATimeoutListingIt) {
  RankRoster mine = RankRoster::join(rank(job_, 0, 3));
  const std::string m = messageOf<TimeoutError>([&] { mine.arriveAndWait("agreement 'test'", milliseconds(200)); });
  EXPECT_TRUE(contains(m,
                       "agreement 'test' timed out after 0.2 s: ranks 1, 2 of 3 did not arrive (rank 0 waited; "
                       "local rank 1: no process has started its job yet"))
      << m;
}

TEST_F(RankRosterTest, ALaunchersWorkerThatExitsBeforeJoiningIsNamedByItsPeers) {
  RankRoster launcher = RankRoster::createForLauncher(job_, 2);
  const pid_t early = forkChild([] { return 0; });  // a worker that exits 0 at once
  launcher.recordStarted(1, early);
  const pid_t waiter = forkChild([&] {
    RankRoster roster = RankRoster::join(rank(job_, 0, 2));
    const std::string m = messageOf<PeerError>([&] { roster.arriveAndWait("agreement 'test'", seconds(60)); });
    return contains(m, "rank 1 (pid " + std::to_string(early) + " on " + thisHost() + ") exited before the job finished")
               ? 0
               : 1;
  });
  launcher.recordStarted(0, waiter);  // after it joined or before: the same slot
  EXPECT_EQ(waitChild(waiter), 0);
  EXPECT_EQ(waitChild(early), 0);
  EXPECT_TRUE(launcher.anyJoined());
  EXPECT_EQ(launcher.stateOf(1), RosterState::kStarted);
  EXPECT_EQ(launcher.stateOf(0), RosterState::kJoined) << "it failed, so it did not finish";
  EXPECT_TRUE(exists()) << "the launcher, alive, removes it itself";
  launcher.unlink();
  EXPECT_FALSE(exists());
}

TEST_F(RankRosterTest, AChildOfTheProcessTheLauncherStartedTakesItsRankOverAndNoOtherProcessDoes) {
  RankRoster launcher = RankRoster::createForLauncher(job_, 2);
  int recorded[2];
  ASSERT_EQ(::pipe(recorded), 0);
  // A wrapper (`sh -c 'cohort train …; …'`): the launcher records it, its child joins.
  const pid_t wrapper = forkChild([&] {
    ::close(recorded[1]);
    char c;
    if (::read(recorded[0], &c, 1) != 1) return 1;
    return waitChild(forkChild([&] {
      RankRoster::join(rank(job_, 1, 2)).leave(true);
      return 0;
    }));
  });
  ::close(recorded[0]);
  launcher.recordStarted(1, wrapper);
  ASSERT_EQ(::write(recorded[1], "r", 1), 1);
  ::close(recorded[1]);
  EXPECT_EQ(waitChild(wrapper), 0);
  EXPECT_EQ(launcher.stateOf(1), RosterState::kFinished);
  const pid_t stranger = forkChild([&] {
    const std::string m = messageOf<InvalidArgument>([&] { RankRoster::join(rank(job_, 1, 2)); });
    return contains(m, "which has exited, but that job still runs here (its launcher is process " +
                           std::to_string(::getppid()) + ")")
               ? 0
               : (std::fprintf(stderr, "got: %s\n", m.c_str()), 1);
  });
  EXPECT_EQ(waitChild(stranger), 0);
}

TEST_F(RankRosterTest, RanksMeetRepeatedlyAndTheLastOneOutRemovesTheName) {
  constexpr int kRanks = 3;
  std::vector<pid_t> children;
  for (int r = 0; r < kRanks; ++r) {
    children.push_back(forkChild([&, r] {
      RankRoster roster = RankRoster::join(rank(job_, r, kRanks));
      for (int i = 0; i < 5; ++i) roster.arriveAndWait("round " + std::to_string(i), seconds(30));
      roster.leave(true);
      return 0;
    }));
  }
  for (pid_t c : children) EXPECT_EQ(waitChild(c), 0);
  EXPECT_FALSE(exists());
  EXPECT_TRUE(sweepStaleSegments().empty());
}

TEST_F(RankRosterTest, TheSweepRemovesAStaleRosterAndKeepsALiveOne) {
  RankRoster live = RankRoster::join(rank(job_, 0, 2));
  const std::string staleJob = freshJobId();
  ASSERT_EQ(waitChild(forkChild([&] {
              RankRoster::join(rank(staleJob, 0, 2));  // its rank 1 never joins: the name stays
              ::_exit(0);
              return 0;
            })),
            0);
  const std::vector<std::string> removed = sweepStaleSegments();
  EXPECT_EQ(removed, std::vector<std::string>{segmentName(staleJob, "roster")});
  EXPECT_TRUE(exists());
}

}  // namespace
}  // namespace cohort::ipc
