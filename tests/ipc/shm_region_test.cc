#include "ipc/shm_region.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"
#include "ipc/shm_names.h"
#include "tests/ipc/multiproc.h"

namespace cohort::ipc {
namespace {

using namespace std::chrono_literals;
using testing::forkChild;
using testing::freshJobId;
using testing::ScopedShmDir;
using testing::waitChild;

constexpr size_t kWords = 1000;  // payload of uint32 words in the sharing test

template <class F>
std::string messageOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no exception)";
}

bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

void patchHeader(const std::string& path, size_t offset, const void* bytes, size_t n) {
  int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, bytes, n, static_cast<off_t>(offset)), static_cast<ssize_t>(n));
  close(fd);
}

TEST(ShmRegion, OpenersSeeTheCreatorsPayloadAndEachOthersWrites) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  const size_t bytes = (kWords + 3) * sizeof(uint32_t);
  std::vector<pid_t> children;
  for (int k = 0; k < 3; ++k) {
    children.push_back(forkChild([&, k] {
      // Forked before the segment exists: open() must poll until it is published.
      ShmRegion r = ShmRegion::open({.jobId = job, .name = "data", .payloadBytes = bytes, .timeout = 30s});
      auto* words = static_cast<uint32_t*>(r.payload());
      for (size_t i = 0; i < kWords; ++i) {
        if (words[i] != 3 * i + 1) return 1;
      }
      words[kWords + k] = 100 + k;  // this child's slot; the parent reads it after we exit
      return r.isPublished() && !r.isCreator() ? 0 : 2;
    }));
  }
  ShmRegion r = ShmRegion::create({.jobId = job, .name = "data", .payloadBytes = bytes, .unlinkOnDestroy = true});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(r.payload()) % 4096, 0u);
  auto* words = static_cast<uint32_t*>(r.payload());
  for (size_t i = 0; i < kWords; ++i) words[i] = 3 * i + 1;
  r.publish();
  for (pid_t c : children) EXPECT_EQ(waitChild(c), 0);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(words[kWords + k], 100u + k);
  EXPECT_EQ(r.path(), dir.privatePath() + "/" + segmentName(job, "data"));
}

TEST(ShmRegion, OpenTimesOutNamingTheSegmentAndWhatIsMissing) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  auto start = std::chrono::steady_clock::now();
  std::string msg = messageOf([&] { ShmRegion::open({.jobId = job, .name = "params", .timeout = 200ms}); });
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_NE(msg.find("timed out after 0.2 s waiting for local rank 0 (the creator) to publish"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find(segmentName(job, "params")), std::string::npos) << msg;
  EXPECT_NE(msg.find("of job " + job), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  EXPECT_GE(elapsed, 200ms);
  EXPECT_LT(elapsed, 5s);

  ShmRegion unpublished = ShmRegion::create({.jobId = job, .name = "params", .payloadBytes = 8});
  EXPECT_THROW(ShmRegion::open({.jobId = job, .name = "params", .payloadBytes = 8, .timeout = 50ms}), TimeoutError);
  msg = messageOf([&] { ShmRegion::open({.jobId = job, .name = "params", .payloadBytes = 8, .timeout = 50ms}); });
  EXPECT_NE(msg.find("not published yet"), std::string::npos) << msg;
  msg = messageOf(
      [&] { ShmRegion::open({.jobId = job, .name = "params", .payloadBytes = 8, .generation = 1, .timeout = 50ms}); });
  EXPECT_NE(msg.find("older generation 0"), std::string::npos) << msg;
}

TEST(ShmRegion, CreatorThatDiesBeforePublishingIsAPeerError) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  pid_t child = forkChild([&] {
    ShmRegion::create({.jobId = job, .name = "params", .payloadBytes = 64});
    return 0;  // never publishes
  });
  // Wait for the child to exit but do not reap it: a zombie creator must count as gone.
  siginfo_t info{};
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (info.si_pid == 0 && std::chrono::steady_clock::now() < deadline) {
    ASSERT_EQ(waitid(P_PID, child, &info, WEXITED | WNOHANG | WNOWAIT), 0);
    if (info.si_pid == 0) std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(info.si_pid, child) << "child did not exit";
  std::string msg =
      messageOf([&] { ShmRegion::open({.jobId = job, .name = "params", .payloadBytes = 64, .timeout = 10s}); });
  EXPECT_NE(msg.find("exited before publishing"), std::string::npos) << msg;
  EXPECT_EQ(waitChild(child), 0);
  EXPECT_THROW(ShmRegion::open({.jobId = job, .name = "params", .payloadBytes = 64, .timeout = 10s}), PeerError);
}

TEST(ShmRegion, OpenRejectsCorruptOrMismatchedHeaders) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  ShmRegion r = ShmRegion::create({.jobId = job, .name = "p", .payloadBytes = 64, .generation = 2});
  r.publish();
  ShmRegion::OpenOptions open{.jobId = job, .name = "p", .payloadBytes = 64, .generation = 2, .timeout = 2s};
  EXPECT_NO_THROW(ShmRegion::open(open));

  auto wrongSize = open;
  wrongSize.payloadBytes = 128;
  EXPECT_NE(messageOf([&] { ShmRegion::open(wrongSize); }).find("holds 64 payload bytes"), std::string::npos);
  auto olderProcess = open;
  olderProcess.generation = 1;
  EXPECT_THROW(ShmRegion::open(olderProcess), IoError);

  const uint64_t badMagic = 0x1234;
  patchHeader(r.path(), offsetof(SegmentHeader, magic), &badMagic, sizeof badMagic);
  EXPECT_NE(messageOf([&] { ShmRegion::open(open); }).find("is not a Cohort shared-memory segment"), std::string::npos);
  patchHeader(r.path(), offsetof(SegmentHeader, magic), &kSegmentMagic, sizeof kSegmentMagic);
  const uint32_t badVersion = kSegmentLayoutVersion + 7;
  patchHeader(r.path(), offsetof(SegmentHeader, layoutVersion), &badVersion, sizeof badVersion);
  EXPECT_NE(messageOf([&] { ShmRegion::open(open); }).find("layout version"), std::string::npos);
  EXPECT_THROW(ShmRegion::open(open), IoError);
}

TEST(ShmRegion, CreateRefusesALiveSegmentAndReplacesStaleOnes) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  ShmRegion first = ShmRegion::create({.jobId = job, .name = "p", .payloadBytes = 64});
  std::string msg = messageOf([&] { ShmRegion::create({.jobId = job, .name = "p", .payloadBytes = 64}); });
  EXPECT_NE(msg.find("already exists"), std::string::npos) << msg;
  EXPECT_NE(msg.find(segmentName(job, "p")), std::string::npos) << msg;

  // A newer generation replaces an older one; the older creator's unlink() leaves the successor alone.
  ShmRegion second = ShmRegion::create({.jobId = job, .name = "p", .payloadBytes = 64, .generation = 1});
  first.unlink();
  EXPECT_TRUE(exists(second.path()));
  second.unlink();
  EXPECT_FALSE(exists(second.path()));

  // A dead creator's leftover of the same generation is replaced.
  pid_t child = forkChild([&] {
    ShmRegion::create({.jobId = job, .name = "q", .payloadBytes = 64}).publish();
    return 0;
  });
  ASSERT_EQ(waitChild(child), 0);
  ShmRegion third = ShmRegion::create({.jobId = job, .name = "q", .payloadBytes = 64});
  EXPECT_TRUE(third.isCreator());
  EXPECT_FALSE(third.isPublished());
}

TEST(ShmRegion, UnlinkOnDestroyIsOptional) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  std::string kept;
  std::string removed;
  {
    ShmRegion a = ShmRegion::create({.jobId = job, .name = "kept", .payloadBytes = 1});
    ShmRegion b = ShmRegion::create({.jobId = job, .name = "gone", .payloadBytes = 1, .unlinkOnDestroy = true});
    ShmRegion moved = std::move(b);  // the moved-to object inherits the duty
    kept = a.path();
    removed = moved.path();
  }
  EXPECT_TRUE(exists(kept));
  EXPECT_FALSE(exists(removed));
}

void expectNoSpaceError(const Error& e, const std::string& dir, const std::string& name) {
  std::string msg = e.what();
  EXPECT_EQ(e.code(), ExitCode::kUsage);
  EXPECT_NE(msg.find("not enough shared memory in " + dir + " for segment " + name + ": need "), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("available (statvfs)"), std::string::npos) << msg;
}

TEST(ShmRegion, TooLittleSpaceIsAClearIoErrorBeforeAnyPageIsTouched) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  struct statvfs vfs {};
  ASSERT_EQ(statvfs(dir.path().c_str(), &vfs), 0);
  // More than the whole file system holds: fails however much space other processes free meanwhile.
  size_t tooMuch = static_cast<size_t>(vfs.f_blocks) * vfs.f_frsize + (size_t{1} << 30);
  try {
    ShmRegion::create({.jobId = job, .name = "huge", .payloadBytes = tooMuch, .unlinkOnDestroy = true});
    ADD_FAILURE() << "creating " << tooMuch << " bytes in " << dir.path() << " succeeded";
  } catch (const IoError& e) {
    expectNoSpaceError(e, dir.path(), segmentName(job, "huge"));
  }
  EXPECT_FALSE(exists(dir.privatePath() + "/" + segmentName(job, "huge")));  // nothing left behind
}

// In a child with its own mount namespace, a 1 MiB tmpfs as COHORT_SHM_DIR. Exit codes: 0 ok,
// 77 unshare refused, 78 mount refused, others a failed check.
int checkSmallTmpfs(const std::string& mountPoint) {
  if (unshare(CLONE_NEWNS) != 0) return 77;
  if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 78;
  if (mount("tmpfs", mountPoint.c_str(), "tmpfs", 0, "size=1m,mode=0700") != 0) return 78;
  const std::string job = freshJobId();
  try {
    ShmRegion::create({.jobId = job, .name = "big", .payloadBytes = 4 << 20});
    return 1;
  } catch (const IoError& e) {
    expectNoSpaceError(e, mountPoint, segmentName(job, "big"));
    if (::testing::Test::HasFailure()) return 2;
  }
  // What fits is fully usable: every page was reserved, so writing it cannot raise SIGBUS.
  ShmRegion fits = ShmRegion::create({.jobId = job, .name = "fits", .payloadBytes = 512 << 10});
  std::memset(fits.payload(), 0x5a, fits.payloadBytes());
  return 0;
}

TEST(ShmRegion, TooSmallTmpfsIsAClearIoError) {
  ScopedShmDir dir;  // the tmpfs is mounted over it, in the child's namespace only
  int code = waitChild(forkChild([&] { return checkSmallTmpfs(dir.path()); }), 30s);
  if (code == 77 || code == 78) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << (code == 77 ? "unshare(CLONE_NEWNS)" : "mount")
                 << " not permitted, e.g. inside Bazel's sandbox); the statvfs-sized test covers the error path";
  }
  EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace cohort::ipc
