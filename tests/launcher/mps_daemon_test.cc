// MpsDaemon's directory against another local user (issue 44, item 4): `cohortrun --mps` used
// ${TMPDIR}/cohortrun-<job>/ and adopted one that existed, so another user who made it first (0777,
// with a symlink planted as mps-control.out) got the job's files and made it write through the
// link. Now the directory is made with mkdtemp: theirs is never used nor written to, and nothing
// is followed. The other user's moves run with tests/support/other_user.h (root needed: the target
// is no-sandbox; skipped with the reason otherwise). A fake nvidia-cuda-mps-control stands in for
// NVIDIA's, as in cohortrun_mps_test.cc.
#include "launcher/mps_daemon.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/other_user.h"

namespace cohort::launcher {
namespace {

// -d prints a line (which would go through a planted mps-control.out) and makes the control pipe;
// a client's quit removes it.
constexpr const char* kFakeDaemon = R"(#!/bin/sh
if [ "$1" = -d ]; then
  echo "fake daemon starting"
  mkfifo "$CUDA_MPS_PIPE_DIRECTORY/control"
  exit 0
fi
read command
echo "client $command"
if [ "$command" = quit ]; then rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"; fi
)";

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> namesIn(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename());
  return names;
}

TEST(MpsDaemonTest, AnotherUsersDirectoryOfTheJobsNameIsNeverAdoptedNorItsSymlinkFollowed) {
  std::string why;
  const auto other = cohort::testing::otherUser(&why);
  if (!other) GTEST_SKIP() << why;
  // A world-writable TMPDIR, as /tmp is (the other user must reach it: not under $TEST_TMPDIR).
  std::string base = "/tmp/mps-daemon-test.XXXXXX";
  ASSERT_NE(::mkdtemp(base.data()), nullptr);
  ASSERT_EQ(::chmod(base.c_str(), 01777), 0);
  ASSERT_EQ(::mkdir((base + "/bin").c_str(), 0755), 0);
  const std::string fake = base + "/bin/nvidia-cuda-mps-control";
  std::ofstream(fake) << kFakeDaemon;
  ASSERT_EQ(::chmod(fake.c_str(), 0755), 0);
  const std::string victim = base + "/victim";  // one of this user's files
  std::ofstream(victim) << "precious\n";

  const std::string theirs = base + "/cohortrun-cr-1-2-3";
  ASSERT_EQ(cohort::testing::runAsOtherUser(
                *other,
                [&] {
                  return ::mkdir(theirs.c_str(), 0777) == 0 && ::chmod(theirs.c_str(), 0777) == 0 &&
                                 ::symlink(victim.c_str(), (theirs + "/mps-control.out").c_str()) == 0
                             ? 0
                             : 1;
                }),
            0);

  auto daemon = MpsDaemon::start({.jobDirectory = theirs, .environment = {"PATH=" + base + "/bin:/usr/bin:/bin"}});
  const std::string pipe = daemon->pipeDirectory();
  const std::string mine = pipe.substr(0, pipe.rfind('/'));
  EXPECT_NE(mine, theirs) << "their directory was adopted";
  EXPECT_EQ(mine.rfind(theirs + "-", 0), 0u) << mine;
  struct stat st {};
  ASSERT_EQ(::lstat(mine.c_str(), &st), 0) << mine;
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(readAll(mine + "/mps-control.out"), "fake daemon starting\n");
  EXPECT_TRUE(daemon->stop().empty());
  EXPECT_NE(::access(mine.c_str(), F_OK), 0) << "stop() removes the job's directory";
  EXPECT_EQ(readAll(victim), "precious\n") << "written through their symlink";
  EXPECT_EQ(namesIn(theirs), std::vector<std::string>{"mps-control.out"}) << "their directory was written to";
  std::filesystem::remove_all(base);
}

}  // namespace
}  // namespace cohort::launcher
