// Checkpoints, their temporaries and their lock on a shared machine (issue 44, items 3 and 5): a
// second, unprivileged local user (tests/support/other_user.h) plants files and symbolic links
// where the victim (this test) writes, or holds the victim's stale lock; the victim's files stay
// the victim's, the attacker's stay untouched, and a lock is judged by who holds it now.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "nn/checkpoint.h"
#include "runtime/error.h"
#include "tests/support/other_user.h"

namespace cohort::nn {
namespace {

using testing::OtherUser;

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<NamedTensor> tensors() {
  runtime::Tensor w = runtime::Tensor::zeros({2, 3});
  for (int64_t i = 0; i < w.numel(); ++i) w.data()[i] = static_cast<float>(i);
  return {{"w", w}};
}

// A process that holds a flock on `file` (opened read-only, as anyone may open a 0644 file) until
// released or destroyed; as `user` when given, else as this user. Synchronised by pipes: the
// constructor returns once the lock is held (or the child failed, which fails the test).
class LockHolder {
 public:
  LockHolder(const std::string& file, const OtherUser* user) {
    int ready[2], release[2];
    EXPECT_EQ(::pipe(ready), 0);
    EXPECT_EQ(::pipe(release), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(ready[0]);
      ::close(release[1]);
      if (user && (::setgroups(0, nullptr) != 0 || ::setgid(user->gid) != 0 || ::setuid(user->uid) != 0)) ::_exit(2);
      const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || ::flock(fd, LOCK_SH) != 0) ::_exit(3);
      char c = 1;
      if (::write(ready[1], &c, 1) != 1) ::_exit(4);
      (void)!::read(release[0], &c, 1);  // EOF when the test releases it (or dies)
      ::_exit(0);
    }
    ::close(ready[1]);
    ::close(release[0]);
    release_ = release[1];
    char c = 0;
    EXPECT_EQ(::read(ready[0], &c, 1), 1) << "the lock holder did not start";
    ::close(ready[0]);
  }
  ~LockHolder() {
    ::close(release_);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int release_ = -1;
};

class CheckpointOtherUserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Under /tmp, not TEST_TMPDIR: the other user must be able to reach it (Bazel's output base
    // lies under root's 0700 home).
    std::string templ = "/tmp/ckpt_other_XXXXXX";
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);  // a shared directory, as /tmp is
    path_ = dir_ + "/model.safetensors";
    victimFile_ = dir_ + "/victim.txt";
    std::ofstream(victimFile_) << "the victim's own file\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::optional<OtherUser> other() {
    std::string why;
    auto user = testing::otherUser(&why);
    if (!user) why_ = why;
    return user;
  }

  std::string dir_, path_, victimFile_, why_;
};

// Item 5: the temporary of this process's pid pre-created 0666 by the attacker became the
// checkpoint (owned by the attacker, mode 0666: weights anyone could edit before a resume), and a
// symbolic link there made the victim write through it.
TEST_F(CheckpointOtherUserTest, TemporariesPlantedByAnotherUserAreNeverWrittenOrAdopted) {
  auto user = other();
  if (!user) GTEST_SKIP() << why_;
  const std::string prefix = dir_ + "/.model.safetensors.tmp.";
  const pid_t me = ::getpid();
  ASSERT_EQ(
      testing::runAsOtherUser(*user,
                              [&] {
                                std::ofstream(prefix + std::to_string(me)) << "attacker";
                                if (::chmod((prefix + std::to_string(me)).c_str(), 0666) != 0) return 1;
                                for (int i = 1; i < 50; ++i) {
                                  if (::symlink(victimFile_.c_str(), (prefix + std::to_string(me + i)).c_str()) != 0)
                                    return 2;
                                }
                                return 0;
                              }),
      0);
  writeCheckpoint(path_, tensors(), {{"v", "1"}});
  struct stat st {};
  ASSERT_EQ(::lstat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_uid, ::geteuid()) << "the checkpoint is the attacker's file";
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(readCheckpoint(path_).metadata.at("v"), "1");
  EXPECT_EQ(readText(prefix + std::to_string(me)), "attacker");
  ASSERT_EQ(::lstat((prefix + std::to_string(me)).c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, user->uid);
  EXPECT_EQ(readText(victimFile_), "the victim's own file\n");
  // The attacker's orphans are not ours to remove either, even once their "writer" is gone.
  prepareCheckpointDestination(path_);
  EXPECT_TRUE(std::filesystem::exists(prefix + std::to_string(me)));
}

// The stale-temporary sweep removes the orphans of killed writers: never another user's file, never
// a symbolic link (nor what it names), whatever pid its name holds.
TEST_F(CheckpointOtherUserTest, TheSweepOfKilledWritersTemporariesNeverRemovesAnotherUsersFiles) {
  auto user = other();
  if (!user) GTEST_SKIP() << why_;
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(dead, &status, 0), dead);
  const std::string prefix = dir_ + "/.model.safetensors.tmp." + std::to_string(dead);
  ASSERT_EQ(testing::runAsOtherUser(*user,
                                    [&] {
                                      std::ofstream(prefix) << "attacker";
                                      return ::symlink(victimFile_.c_str(), (prefix + ".abcdef").c_str()) == 0 ? 0 : 1;
                                    }),
            0);
  EXPECT_EQ(prepareCheckpointDestination(path_), 0u);
  EXPECT_EQ(readText(prefix), "attacker");
  struct stat st {};
  EXPECT_EQ(::lstat((prefix + ".abcdef").c_str(), &st), 0);
  EXPECT_EQ(readText(victimFile_), "the victim's own file\n");
}

// Item 3: a lock file another user made is no lock of ours: refused as such, at once.
TEST_F(CheckpointOtherUserTest, ALockFileOwnedByAnotherUserIsRefusedNamingTheOwner) {
  auto user = other();
  if (!user) GTEST_SKIP() << why_;
  const std::string lock = dir_ + "/.model.safetensors.lock";
  ASSERT_EQ(testing::runAsOtherUser(*user,
                                    [&] {
                                      std::ofstream(lock) << "pid 1 on elsewhere\n";
                                      return 0;
                                    }),
            0);
  try {
    CheckpointLock held(path_);
    ADD_FAILURE() << "another user's lock file was taken";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind(lock + " is owned by ", 0), 0u) << m;
    EXPECT_NE(m.find(user->name), std::string::npos) << m;
    EXPECT_NE(m.find("uid " + std::to_string(user->uid)), std::string::npos) << m;
    EXPECT_NE(m.find(", not you: "), std::string::npos) << m;
  }
}

// Item 3: the lock file a killed run left (0644, as older versions made it) is flocked, read-only,
// by another user's process. That holder is no run of ours: --resume takes the lock.
TEST_F(CheckpointOtherUserTest, AStaleLockHeldByAnotherUsersProcessDoesNotBlock) {
  auto user = other();
  if (!user) GTEST_SKIP() << why_;
  const std::string lock = dir_ + "/.model.safetensors.lock";
  std::ofstream(lock) << "pid 99999 on killed-run\n";
  ASSERT_EQ(::chmod(lock.c_str(), 0644), 0);
  LockHolder attacker(lock, &*user);
  try {
    CheckpointLock held(path_);
    EXPECT_NE(readText(lock).find("pid " + std::to_string(::getpid()) + " on "), std::string::npos) << readText(lock);
    struct stat st {};
    ASSERT_EQ(::stat(lock.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u);
  } catch (const IoError& e) {
    ADD_FAILURE() << "the other user's flock blocked the run: " << e.what();
  }
}

// Item 3: a lock that a live process of ours holds refuses the run, naming that holder, not the pid
// the file records (a killed run's).
TEST_F(CheckpointOtherUserTest, ALiveLockIsNamedByItsHolderNotByWhatTheFileSays) {
  const std::string lock = dir_ + "/.model.safetensors.lock";
  std::ofstream(lock) << "pid 99999 on killed-run\n";
  LockHolder ours(lock, nullptr);
  try {
    CheckpointLock held(path_);
    ADD_FAILURE() << "a held lock was taken";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("another run is writing its checkpoints here (pid " + std::to_string(ours.pid()) + " on "),
              std::string::npos)
        << m;
    EXPECT_EQ(m.find("99999"), std::string::npos) << m;
  }
  EXPECT_EQ(checkpointLockHolder(path_).value_or("none").rfind("pid " + std::to_string(ours.pid()), 0), 0u);
}

TEST_F(CheckpointOtherUserTest, ALockFileThatIsASymbolicLinkIsRefused) {
  const std::string lock = dir_ + "/.model.safetensors.lock";
  ASSERT_EQ(::symlink(victimFile_.c_str(), lock.c_str()), 0);
  try {
    CheckpointLock held(path_);
    ADD_FAILURE() << "a symbolic link was taken for the lock";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(lock + " is a symbolic link"), std::string::npos) << e.what();
  }
  EXPECT_EQ(readText(victimFile_), "the victim's own file\n");
}

}  // namespace
}  // namespace cohort::nn
