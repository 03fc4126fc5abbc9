// The private shared-memory directory (ipc/private_dir.h) and what another local user can do to a
// job's names (issue 44, items 1 and 2): the directory is made 0700 and ours; one that another user
// made first, or a symlink, is refused at once naming it and its owner, and nothing is written into
// theirs; a file in it that this user did not make is refused at once, never waited on; squats of
// the names jobs used before (abstract claim sockets, /dev/shm/cohort.<id>.*) change nothing.
// The multi-user cases run the other user's moves with tests/support/other_user.h (root needed;
// skipped with the reason otherwise); their shared-memory directory is a 1777 one under /dev/shm,
// as /dev/shm itself is.
#include "ipc/private_dir.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <string>

#include "ipc/job_segment.h"
#include "ipc/rank_claim.h"
#include "ipc/rank_roster.h"
#include "ipc/shm_names.h"
#include "ipc/shm_region.h"
#include "runtime/error.h"
#include "runtime/user_name.h"
#include "tests/ipc/multiproc.h"
#include "tests/support/other_user.h"

namespace cohort::ipc {
namespace {

using std::chrono::seconds;
using testing::forkChild;
using testing::freshJobId;
using testing::ScopedShmDir;
using testing::waitChild;
using Clock = std::chrono::steady_clock;

// The InvalidArgument's message of `fn`, or "" when it throws none; `elapsed` how long it took.
std::string refusalOf(const std::function<void()>& fn, double* elapsed = nullptr) {
  const auto start = Clock::now();
  std::string message;
  try {
    fn();
  } catch (const InvalidArgument& e) {
    message = e.what();
  }
  if (elapsed) *elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  return message;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

mode_t modeOf(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? st.st_mode : 0;
}

TEST(PrivateDirectory, IsMadeWithMode0700AndAWiderModeOfOursIsSetRight) {
  ScopedShmDir shm;
  const std::string path = shm.path() + "/cohort-" + std::to_string(::geteuid());
  EXPECT_EQ(privateDirectoryPath(), path);
  const mode_t oldMask = ::umask(0277);  // would make it 0500
  PrivateDirectory dir = openPrivateDirectory();
  ::umask(oldMask);
  EXPECT_EQ(dir.path, path);
  EXPECT_TRUE(S_ISDIR(modeOf(path)));
  EXPECT_EQ(modeOf(path) & 07777, 0700u);
  ASSERT_EQ(::chmod(path.c_str(), 0777), 0);
  openPrivateDirectory();
  EXPECT_EQ(modeOf(path) & 07777, 0700u);
}

TEST(PrivateDirectory, AFileInItThatThisUserDidNotMakeIsRefusedAtOnce) {
  // A symlink where a segment goes (only root could plant one): never followed, never waited on.
  ScopedShmDir shm;
  const std::string job = freshJobId();
  const std::string target = shm.path() + "/target";
  ASSERT_EQ(::close(::open(target.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600)), 0);
  const std::string params = shm.privatePath() + "/" + segmentName(job, "params");
  ASSERT_EQ(::symlink(target.c_str(), params.c_str()), 0);
  double elapsed = 0;
  const std::string m = refusalOf(
      [&] { ShmRegion::open({.jobId = job, .name = "params", .payloadBytes = 64, .timeout = seconds(30)}); }, &elapsed);
  EXPECT_EQ(m.rfind("shared-memory segment " + params + " is a symbolic link owned by ", 0), 0u) << m;
  EXPECT_LT(elapsed, 5.0) << "waited on it";
  EXPECT_NE(refusalOf([&] { ShmRegion::create({.jobId = job, .name = "params", .payloadBytes = 64}); }), "");
  EXPECT_TRUE(S_ISLNK(modeOf(params))) << "the refusal removed nothing";
}

// --- another local user --------------------------------------------------------------------------

class OtherUserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    std::optional<cohort::testing::OtherUser> other = cohort::testing::otherUser(&why);
    if (!other) GTEST_SKIP() << why;
    other_ = *other;
    otherNamed_ = runtime::describeUser(other_.uid);  // "nobody (uid 65534)"
  }
  // Runs `fn` as the other user; true when it returned 0.
  bool asOther(const std::function<int()>& fn) { return cohort::testing::runAsOtherUser(other_, fn) == 0; }

  cohort::testing::OtherUser other_;
  std::string otherNamed_;
};

// One rank of a two-rank job, as train::Job and the strategies start one: the claim, the roster,
// the parameter and job segments, a meeting of both ranks. Exits 0 when all of it worked.
int runRank(const std::string& job, int rank) {
  RankClaim claim = RankClaim::take(job, rank, "COHORT_JOB_ID=" + job);
  RankRoster roster = RankRoster::join({.jobId = job, .rank = rank, .localRank = rank, .localWorldSize = 2});
  for (const char* name : {"params", "job"}) {
    joinRankRegion({.jobId = job, .name = name, .localRank = rank, .payloadBytes = 4096, .timeout = seconds(10)},
                   nullptr);
  }
  roster.arriveAndWait("the end of the test job", seconds(10));
  roster.leave(true);
  return 0;
}

// Runs both ranks of job `job`; true when both exit 0 within 20 s.
bool runTwoRankJob(const std::string& job) {
  const pid_t zero = forkChild([&] { return runRank(job, 0); });
  const pid_t one = forkChild([&] { return runRank(job, 1); });
  const int zeroCode = waitChild(zero, seconds(20));
  const int oneCode = waitChild(one, seconds(20));
  EXPECT_EQ(zeroCode, 0) << job;
  EXPECT_EQ(oneCode, 0) << job;
  removeJobSegments(job);
  return zeroCode == 0 && oneCode == 0;
}

// The abstract socket name by which issue 33's RankClaim held a rank (no permissions, computable).
std::string oldClaimName(const std::string& shmDir, const std::string& job, int rank) {
  struct stat st {};
  ::stat(shmDir.c_str(), &st);
  return "cohort-rank/" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + "/" + job + "/" +
         std::to_string(rank);
}

TEST_F(OtherUserTest, SquatsOfTheNamesJobsUsedBeforeNeitherRefuseNorDelayAJob) {
  ScopedShmDir shm(ScopedShmDir::Kind::kSharedLikeDevShm);
  const std::string fixedId = freshJobId();            // as COHORT_JOB_ID or SLURM's job-step give it
  const std::string launcherId = makeLauncherJobId();  // as cohortrun makes it, from /proc
  int ready[2], release[2];
  ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(release, O_CLOEXEC), 0);
  // The squatter holds the old claim names (abstract sockets) while the job runs, and has made the
  // old segment names in the shared directory, mode 0666.
  const pid_t squatter = forkChild([&] {
    ::close(ready[0]);
    ::close(release[1]);
    return cohort::testing::runAsOtherUser(other_, [&] {
      std::vector<int> held;
      for (const std::string& job : {fixedId, launcherId}) {
        for (const char* name : {"params", "job", "roster"}) {
          const std::string path = shm.path() + "/" + segmentName(job, name);
          const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
          if (fd < 0 || ::fchmod(fd, 0666) != 0 || ::ftruncate(fd, 8192) != 0) return 2;
        }
        for (int rank : {0, 1}) {
          const std::string name = oldClaimName(shm.path(), job, rank);
          sockaddr_un address{};
          address.sun_family = AF_UNIX;
          std::memcpy(address.sun_path + 1, name.data(), name.size());
          const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
          const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
          if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0 || ::listen(fd, 8) != 0) return 3;
          held.push_back(fd);
        }
      }
      if (::write(ready[1], "r", 1) != 1) return 4;
      char c;
      return ::read(release[0], &c, 1) == 0 ? 0 : 5;  // until the test is done
    });
  });
  ::close(ready[1]);
  ::close(release[0]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1) << "the squatter did not get ready";
  EXPECT_TRUE(runTwoRankJob(fixedId));
  EXPECT_TRUE(runTwoRankJob(launcherId));
  ::close(release[1]);
  EXPECT_EQ(waitChild(squatter, seconds(20)), 0);
  ::close(ready[0]);
}

TEST_F(OtherUserTest, ItsDirectoryInOurPrivateDirectorysNameIsRefusedAtOnceNamingItAndItsOwner) {
  ScopedShmDir shm(ScopedShmDir::Kind::kSharedLikeDevShm);
  const std::string path = shm.path() + "/cohort-" + std::to_string(::geteuid());
  ASSERT_TRUE(asOther([&] { return ::mkdir(path.c_str(), 0777) == 0 && ::chmod(path.c_str(), 0777) == 0 ? 0 : 1; }));
  const std::string job = freshJobId();
  const std::string expected = "the private shared-memory directory " + path + " belongs to " + otherNamed_;
  double elapsed = 0;
  std::string m = refusalOf(
      [&] { ShmRegion::open({.jobId = job, .name = "params", .payloadBytes = 64, .timeout = seconds(30)}); }, &elapsed);
  EXPECT_EQ(m.rfind(expected, 0), 0u) << m;
  EXPECT_TRUE(contains(m, "another user created it")) << m;
  EXPECT_TRUE(contains(m, "set COHORT_SHM_DIR to a directory of your own")) << m;
  EXPECT_LT(elapsed, 5.0) << "waited";
  EXPECT_EQ(refusalOf([&] { RankClaim::take(job, 0); }).rfind(expected, 0), 0u);
  EXPECT_EQ(refusalOf([&] { RankRoster::join({.jobId = job, .localWorldSize = 2}); }).rfind(expected, 0), 0u);
  EXPECT_EQ(
      refusalOf([&] { ShmRegion::create({.jobId = job, .name = "params", .payloadBytes = 64}); }).rfind(expected, 0),
      0u);
  EXPECT_EQ(modeOf(path) & 07777, 0777u) << "their directory was changed";
  EXPECT_TRUE(testing::listDirectory(path).empty()) << "something was written into their directory";
}

TEST_F(OtherUserTest, ASymlinkInOurPrivateDirectorysNameIsRefusedAndNothingIsWrittenWhereItPoints) {
  ScopedShmDir shm(ScopedShmDir::Kind::kSharedLikeDevShm);
  const std::string theirs = shm.path() + "/theirs";
  const std::string path = shm.path() + "/cohort-" + std::to_string(::geteuid());
  ASSERT_TRUE(asOther([&] {
    return ::mkdir(theirs.c_str(), 0777) == 0 && ::chmod(theirs.c_str(), 0777) == 0 &&
                   ::symlink(theirs.c_str(), path.c_str()) == 0
               ? 0
               : 1;
  }));
  const std::string job = freshJobId();
  const std::string m = refusalOf([&] { runRank(job, 0); });
  EXPECT_EQ(m.rfind("the private shared-memory directory " + path + " is a symbolic link owned by " + otherNamed_ +
                        ", not a directory: another user created it",
                    0),
            0u)
      << m;
  EXPECT_TRUE(testing::listDirectory(theirs).empty()) << "something was written into their directory";
}

TEST_F(OtherUserTest, ASegmentOrRosterOfAnotherOwnerInThePrivateDirectoryIsRefusedAtOnce) {
  // Root puts the files there and gives them away (as root-run tools might leave files); a job of
  // this user neither waits on them nor uses them.
  ScopedShmDir shm(ScopedShmDir::Kind::kSharedLikeDevShm);
  const std::string job = freshJobId();
  for (const char* name : {"params", "job", "roster"}) {
    const std::string file = shm.privatePath() + "/" + segmentName(job, name);
    ASSERT_EQ(::close(::open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600)), 0);
    cohort::testing::giveToOtherUser(other_, file);
  }
  for (const char* name : {"params", "job"}) {
    const std::string file = shm.privatePath() + "/" + segmentName(job, name);
    const std::string expected = "shared-memory segment " + file + " belongs to " + otherNamed_;
    double elapsed = 0;
    const std::string m = refusalOf(
        [&] { ShmRegion::open({.jobId = job, .name = name, .payloadBytes = 64, .timeout = seconds(30)}); }, &elapsed);
    EXPECT_EQ(m.rfind(expected, 0), 0u) << m;
    EXPECT_LT(elapsed, 5.0) << "waited on " << file;
    EXPECT_EQ(
        refusalOf([&] { ShmRegion::create({.jobId = job, .name = name, .payloadBytes = 64}); }).rfind(expected, 0), 0u);
  }
  const std::string roster = shm.privatePath() + "/" + segmentName(job, "roster");
  EXPECT_EQ(refusalOf([&] {
              RankRoster::join({.jobId = job, .localWorldSize = 2});
            }).rfind("job roster " + roster + " belongs to " + otherNamed_, 0),
            0u);
}

}  // namespace
}  // namespace cohort::ipc
