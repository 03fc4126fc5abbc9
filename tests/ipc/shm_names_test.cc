#include "ipc/shm_names.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <regex>
#include <thread>

#include "gtest/gtest.h"
#include "ipc/process_liveness.h"
#include "ipc/shm_region.h"
#include "tests/ipc/multiproc.h"

namespace cohort::ipc {
namespace {

using testing::forkChild;
using testing::freshJobId;
using testing::ScopedShmDir;
using testing::waitChild;

void touch(const std::string& path, const std::string& content = "") {
  std::ofstream out(path);
  out << content;
}

bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// Moves a file's modification time `seconds` into the past.
void age(const std::string& path, int seconds) {
  timespec times[2];
  clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= seconds;
  times[1] = times[0];
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// The job id a child computes for itself, read back after the child has exited.
std::string jobIdOfExitedChild() {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  pid_t child = forkChild([&] {
    std::string id = makeLauncherJobId();
    return write(fds[1], id.data(), id.size()) == static_cast<ssize_t>(id.size()) ? 0 : 1;
  });
  close(fds[1]);
  EXPECT_EQ(waitChild(child), 0);
  char buffer[128] = {};
  ssize_t n = read(fds[0], buffer, sizeof buffer - 1);
  close(fds[0]);
  EXPECT_GT(n, 0);
  return std::string(buffer, n > 0 ? n : 0);
}

TEST(ShmNames, SanitizesJobIdsAndBuildsNames) {
  EXPECT_EQ(sanitizeJobId("ab-C_9"), "ab-C_9");
  EXPECT_EQ(sanitizeJobId("12.3/x y"), "12_3_x_y");
  EXPECT_EQ(segmentName("slurm.42", "params"), "cohort.slurm_42.params");
  EXPECT_EQ(jobPrefix("j"), "cohort.j.");
  EXPECT_THROW(segmentName("j", "a.b"), InvalidArgument);
  EXPECT_THROW(segmentName("j", ""), InvalidArgument);
  EXPECT_THROW(jobPrefix(""), InvalidArgument);
}

TEST(ShmNames, DirectoryComesFromTheEnvironment) {
  {
    ScopedShmDir dir;
    EXPECT_EQ(shmDirectory(), dir.path());
  }
  if (std::getenv("COHORT_SHM_DIR") == nullptr) {
    EXPECT_EQ(shmDirectory(), "/dev/shm");
  }
}

TEST(ProcessLiveness, ParsesStatWithHostileCommandNames) {
  // comm may hold spaces and parentheses; field 22 is counted after the last ')'.
  std::string stat = "4321 (evil ) S 1 (x) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 19 20";
  // After the last ')': field 3 is R, fields 4..21 are 1..18, field 22 is 777.
  std::optional<ProcStat> parsed = parseProcStat(stat);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->state, 'R');
  EXPECT_EQ(parsed->startTicks, 777u);
  EXPECT_EQ(parsed->parent, 1);
  EXPECT_EQ(parsed->group, 2);
  EXPECT_FALSE(parseProcStat("12 (no close paren S 1 2").has_value());
  EXPECT_FALSE(parseProcStat("12 (short) S 1 2 3").has_value());
  ASSERT_TRUE(processStartTicks(getpid()).has_value());
  EXPECT_TRUE(processIsAlive(getpid(), *processStartTicks(getpid())));
  EXPECT_FALSE(processIsAlive(getpid(), *processStartTicks(getpid()) + 1));  // pid reused
}

TEST(ProcessLiveness, AGroupLivesWhileAMemberRunsAndNotForItsZombies) {
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t leader = forkChild([&] {
    ::setpgid(0, 0);
    ::close(go[1]);
    char c;
    return static_cast<int>(::read(go[0], &c, 1));  // until the parent closes its end
  });
  ::setpgid(leader, leader);
  ::close(go[0]);
  EXPECT_TRUE(groupHasLiveMember(leader));
  ::close(go[1]);
  // Exited, not yet reaped: the group holds only a zombie.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (groupHasLiveMember(leader) && std::chrono::steady_clock::now() < deadline) ::usleep(1000);
  EXPECT_FALSE(groupHasLiveMember(leader)) << "a zombie is not a live member";
  EXPECT_EQ(::kill(-leader, 0), 0) << "the zombie is still there";
  waitChild(leader);
  EXPECT_FALSE(groupHasLiveMember(leader));
}

// A process whose main thread has exited reads 'Z' in /proc/<pid>/stat while its other threads
// still run and hold its files (a rank's claim, a checkpoint being written): cohortrun must not take
// its group for gone and start the next attempt beside it (seen in CI: cli_hogwild_test's restart
// was refused by the old attempt's claim, "held by process N, which is still running").
TEST(ProcessLiveness, AGroupLivesWhileAThreadOfAMemberWhoseMainThreadExitedRuns) {
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t leader = forkChild([&] {
    ::setpgid(0, 0);
    ::close(go[1]);
    std::thread([&] {
      char c;
      ::_exit(static_cast<int>(::read(go[0], &c, 1)));  // until the parent closes its end
    }).detach();
    ::syscall(SYS_exit, 0);  // only the main thread leaves (no unwinding); the process lives on
    return 0;
  });
  ::setpgid(leader, leader);
  ::close(go[0]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto leaderState = [&] {
    std::optional<ProcStat> stat = readProcStat(leader);
    return stat ? stat->state : '?';
  };
  while (leaderState() != 'Z' && std::chrono::steady_clock::now() < deadline) ::usleep(1000);
  ASSERT_EQ(leaderState(), 'Z') << "the main thread did not exit";
  EXPECT_TRUE(groupHasLiveMember(leader)) << "its other thread still runs";
  ::close(go[1]);
  while (groupHasLiveMember(leader) && std::chrono::steady_clock::now() < deadline) ::usleep(1000);
  EXPECT_FALSE(groupHasLiveMember(leader)) << "every thread has ended";
  EXPECT_EQ(waitChild(leader), 0);
}

TEST(ShmNames, LauncherJobIdIsGoneOnlyAfterItsProcessExits) {
  std::string own = makeLauncherJobId();
  EXPECT_TRUE(std::regex_match(own, std::regex("cr-" + std::to_string(getpid()) + "-[0-9]+-[0-9]+"))) << own;
  EXPECT_FALSE(launcherJobIsGone(own));
  std::string childId = jobIdOfExitedChild();
  EXPECT_TRUE(std::regex_match(childId, std::regex("cr-[0-9]+-[0-9]+-[0-9]+"))) << childId;
  EXPECT_TRUE(launcherJobIsGone(childId));
  // The same job id seen from another pid namespace (a container sharing /dev/shm) is never judged.
  std::string otherNamespace = childId.substr(0, childId.rfind('-') + 1) + "1";
  EXPECT_FALSE(launcherJobIsGone(otherNamespace));
  EXPECT_FALSE(launcherJobIsGone("slurm-42"));  // not cohortrun's: never judged gone by its name
  EXPECT_FALSE(launcherJobIsGone("cr-12x-5"));
}

TEST(ShmNames, RemoveJobSegmentsRemovesExactlyThatJob) {
  ScopedShmDir dir;
  for (const char* name : {"cohort.j1.a", "cohort.j1.b", "cohort.j10.a", "cohort.j2.a", "other.j1.a"}) {
    touch(dir.privatePath() + "/" + name);
  }
  EXPECT_EQ(sorted(removeJobSegments("j1")), (std::vector<std::string>{"cohort.j1.a", "cohort.j1.b"}));
  EXPECT_TRUE(exists(dir.privatePath() + "/cohort.j10.a"));
  EXPECT_TRUE(exists(dir.privatePath() + "/cohort.j2.a"));
  EXPECT_TRUE(exists(dir.privatePath() + "/other.j1.a"));
  EXPECT_TRUE(removeJobSegments("j1").empty());  // nothing left is not an error
}

TEST(ShmNames, SweepRemovesSegmentsOfGoneLaunchersOnly) {
  ScopedShmDir dir;
  std::string gone = jobIdOfExitedChild();
  std::string live = makeLauncherJobId();
  touch(dir.privatePath() + "/" + segmentName(gone, "params"));
  touch(dir.privatePath() + "/" + segmentName(gone, "comm"));
  touch(dir.privatePath() + "/" + segmentName(live, "params"));
  touch(dir.privatePath() + "/unrelated.file");
  touch(dir.privatePath() + "/" + sanitizeJobId(gone) + ".not-ours");
  EXPECT_EQ(sorted(sweepStaleSegments()), sorted({segmentName(gone, "comm"), segmentName(gone, "params")}));
  EXPECT_TRUE(exists(dir.privatePath() + "/" + segmentName(live, "params")));
  EXPECT_TRUE(exists(dir.privatePath() + "/unrelated.file"));
  EXPECT_TRUE(exists(dir.privatePath() + "/" + sanitizeJobId(gone) + ".not-ours"));
}

TEST(ShmNames, SweepRemovesOtherJobsSegmentsWhoseCreatorIsGoneAfterGracePeriod) {
  ScopedShmDir dir;
  std::string deadJob = freshJobId();
  std::string liveJob = freshJobId();
  pid_t child = forkChild([&] {
    ShmRegion r = ShmRegion::create({.jobId = deadJob, .name = "params", .payloadBytes = 64});
    r.publish();
    return 0;  // exits without unlinking: a crashed job's leftover
  });
  ASSERT_EQ(waitChild(child), 0);
  ShmRegion mine = ShmRegion::create({.jobId = liveJob, .name = "params", .payloadBytes = 64});
  std::string deadPath = dir.privatePath() + "/" + segmentName(deadJob, "params");
  std::string junkPath = dir.privatePath() + "/cohort.junk.x";
  touch(junkPath, "not a segment header, just some text that is long enough to be read as one");

  EXPECT_TRUE(sweepStaleSegments().empty());  // the dead creator's segment is still within grace
  age(deadPath, 120);
  age(mine.path(), 120);
  age(junkPath, 120);
  EXPECT_EQ(sweepStaleSegments(), std::vector<std::string>{segmentName(deadJob, "params")});
  EXPECT_FALSE(exists(deadPath));
  EXPECT_TRUE(exists(mine.path()));  // its creator (this process) is alive
  EXPECT_TRUE(exists(junkPath));     // unreadable as a segment: skipped, never thrown on
}

}  // namespace
}  // namespace cohort::ipc
