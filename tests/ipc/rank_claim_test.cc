// RankClaim (ipc/rank_claim.h) with forked processes: a rank held by a live process is refused
// naming the holder, its host and the job; the hold ends with its holder however it ends (SIGKILL
// included), with nothing left behind; other ranks and other jobs never collide; a long job id works.
// The claim is a socket file in the private shared-memory directory: removed with its claim, or by
// the sweeps once its holder is gone, never while it lives.
#include "ipc/rank_claim.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "ipc/process_liveness.h"
#include "ipc/shm_names.h"
#include "runtime/error.h"
#include "tests/ipc/multiproc.h"

namespace cohort::ipc {
namespace {

using testing::forkChild;
using testing::freshJobId;
using testing::ScopedShmDir;
using testing::waitChild;

// The message of the InvalidArgument that claiming `rank` of `job` throws, or "" when it succeeds.
std::string refusal(const std::string& job, int rank, const std::string& source = "") {
  try {
    RankClaim::take(job, rank, source);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// A child holding `rank` of `job` until it is killed; returns once it holds it.
pid_t holdRank(const std::string& job, int rank) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t pid = forkChild([&] {
    ::close(ready[0]);
    RankClaim claim = RankClaim::take(job, rank);
    if (::write(ready[1], "c", 1) != 1) return 1;
    for (;;) ::pause();
  });
  ::close(ready[1]);
  char c = 0;
  EXPECT_EQ(::read(ready[0], &c, 1), 1) << "the holder did not claim its rank";
  ::close(ready[0]);
  return pid;
}

TEST(RankClaimTest, ARankHeldByALiveProcessIsRefusedNamingItTheHostAndTheJob) {
  ScopedShmDir shm;
  const std::string job = freshJobId();
  const pid_t holder = holdRank(job, 3);
  ASSERT_GT(holder, 0);
  const std::string m = refusal(job, 3, "COHORT_JOB_ID=" + job);
  EXPECT_NE(m.find("rank 3 of job COHORT_JOB_ID=" + job + " on " + thisHost() + " is already held by process " +
                   std::to_string(holder) + ", which is still running: two jobs were started with the same job id"),
            std::string::npos)
      << m;
  EXPECT_NE(refusal(job, 3).find("of job id " + job + " on"), std::string::npos) << "without a source";
  ::kill(holder, SIGKILL);
  waitChild(holder);
}

TEST(RankClaimTest, TheHoldEndsWithItsHolderEvenKilled) {
  ScopedShmDir shm;
  const std::string job = freshJobId();
  const pid_t holder = holdRank(job, 0);
  ASSERT_GT(holder, 0);
  ASSERT_NE(refusal(job, 0), "");
  ::kill(holder, SIGKILL);
  waitChild(holder);
  EXPECT_EQ(refusal(job, 0), "") << "the id is reusable at once";
  {
    RankClaim again = RankClaim::take(job, 0);
  }
  EXPECT_EQ(refusal(job, 0), "") << "destroying a claim releases it";
}

TEST(RankClaimTest, OtherRanksAndOtherJobsNeverCollide) {
  ScopedShmDir shm;
  const std::string job = freshJobId();
  RankClaim zero = RankClaim::take(job, 0);
  RankClaim one = RankClaim::take(job, 1);
  RankClaim other = RankClaim::take(freshJobId(), 0);
  RankClaim prefix = RankClaim::take(job + "1", 0);  // "job1/0" is not "job/10"
  RankClaim ten = RankClaim::take(job, 10);
  EXPECT_NE(refusal(job, 1), "");
}

TEST(RankClaimTest, JobsWithTheirOwnSharedMemoryDirectoriesNeverCollide) {
  // Containers with their own /dev/shm and the host's network: pid-based job ids repeat there.
  const std::string job = freshJobId();
  ScopedShmDir one;
  RankClaim first = RankClaim::take(job, 0);
  ScopedShmDir other;
  EXPECT_EQ(refusal(job, 0), "") << "another directory, another job";
}

TEST(RankClaimTest, TheClaimIsASocketInThePrivateDirectoryRemovedWithItsClaimOrWhenItsHolderIsGone) {
  ScopedShmDir shm;
  const std::string job = freshJobId();
  const std::string path = shm.privatePath() + "/" + RankClaim::nameFor(job, 0);
  {
    RankClaim claim = RankClaim::take(job, 0);
    struct stat st {};
    ASSERT_EQ(::lstat(path.c_str(), &st), 0) << path;
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_TRUE(removeJobSegments(job).empty()) << "a live claim is never removed";
    EXPECT_TRUE(sweepStaleSegments().empty()) << "a live claim is never swept";
    RankClaim moved = std::move(claim);
    EXPECT_NE(refusal(job, 0), "") << "a moved claim still holds";
  }
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "destroying the claim removes its socket";
  const pid_t holder = holdRank(job, 1);
  ASSERT_GT(holder, 0);
  ::kill(holder, SIGKILL);
  waitChild(holder);
  EXPECT_EQ(removeJobSegments(job), std::vector<std::string>{RankClaim::nameFor(job, 1)}) << "its holder is gone";
  EXPECT_TRUE(testing::listDirectory(shm.privatePath()).empty());
}

TEST(RankClaimTest, ALongJobIdIsHashedIntoTheNameAndStillRefused) {
  ScopedShmDir shm;
  const std::string job = freshJobId() + std::string(200, 'x');
  const std::string name = RankClaim::nameFor(job, 7);
  EXPECT_LE(name.size(), 80u);  // bound as /proc/self/fd/<fd>/<name>, within sun_path's 108 bytes
  EXPECT_NE(name, RankClaim::nameFor(job + "y", 7));
  EXPECT_NE(name, RankClaim::nameFor(job, 8));
  RankClaim held = RankClaim::take(job, 7);
  EXPECT_NE(refusal(job, 7), "");
}

}  // namespace
}  // namespace cohort::ipc
