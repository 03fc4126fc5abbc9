// cohortrun against another local user who made its private shared-memory directory first (issue
// 44): the job is refused at once, exit code 2, one line naming the directory and its owner, and
// nothing is written into their directory. (The squats of the claim and segment names themselves
// are tests/ipc/private_dir_test.cc's.) The other user's move runs with tests/support/other_user.h
// (root needed: the target is no-sandbox; skipped with the reason otherwise); the shared-memory
// directory is a 1777 one under /dev/shm, as /dev/shm itself is.
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "tests/launcher/launcher_test_support.h"
#include "tests/support/other_user.h"

namespace cohort::launcher::testing {
namespace {

using Clock = std::chrono::steady_clock;

// "nobody (uid 65534)", as the message names a user.
std::string named(uid_t uid) {
  const passwd* pw = ::getpwuid(uid);
  const std::string number = "uid " + std::to_string(uid);
  return pw ? std::string(pw->pw_name) + " (" + number + ")" : number;
}

TEST(CohortrunOtherUserTest, APrivateDirectoryMadeByAnotherUserRefusesTheJobAtOnce) {
  std::string why;
  const auto other = cohort::testing::otherUser(&why);
  if (!other) GTEST_SKIP() << why;
  std::string shm = "/dev/shm/cohortrun-other-user-test.XXXXXX";
  ASSERT_NE(::mkdtemp(shm.data()), nullptr);
  ASSERT_EQ(::chmod(shm.c_str(), 01777), 0);
  const std::string theirs = shm + "/cohort-" + std::to_string(::geteuid());
  ASSERT_EQ(
      cohort::testing::runAsOtherUser(
          *other, [&] { return ::mkdir(theirs.c_str(), 0777) == 0 && ::chmod(theirs.c_str(), 0777) == 0 ? 0 : 1; }),
      0);
  const auto start = Clock::now();
  const Output r =
      runLauncher({"--nproc-per-node", "2", "--", testWorker(), "--create-segment"}, {"COHORT_SHM_DIR=" + shm});
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_EQ(r.err, "cohortrun: error: the private shared-memory directory " + theirs + " belongs to " +
                       named(other->uid) + ", not to this user, " + named(::geteuid()) +
                       ": another user created it, which would let them see or block this user's jobs. Ask an "
                       "administrator to remove it, or set COHORT_SHM_DIR to a directory of your own\n")
      << r.describe();
  EXPECT_TRUE(r.out.empty()) << "no worker started\n" << r.describe();
  EXPECT_LT(seconds, 5.0);
  EXPECT_TRUE(std::filesystem::is_empty(theirs)) << "something was written into their directory";
  struct stat st {};
  ASSERT_EQ(::stat(theirs.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0777u) << "their directory was changed";
  std::filesystem::remove_all(shm);
}

}  // namespace
}  // namespace cohort::launcher::testing
