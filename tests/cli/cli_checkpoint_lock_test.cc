// `cohort train --checkpoint PATH --resume` when another user owns PATH's lock file (issue 44 item
// 3): refused at once, exit 2, naming the owner, where the run used to take another user's file for
// its lock. The other user is a second, unprivileged local user (tests/support/other_user.h).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>

#include "tests/cli/cli_test_support.h"
#include "tests/support/other_user.h"

namespace cohort::testing {
namespace {

TEST(CheckpointLockCliTest, ALockFileOwnedByAnotherUserIsRefusedAtOnceNamingTheOwner) {
  std::string why;
  auto user = otherUser(&why);
  if (!user) GTEST_SKIP() << why;
  std::string dir = "/tmp/ckpt_lock_cli_XXXXXX";  // the other user must reach it: not under root's home
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  ASSERT_EQ(::chmod(dir.c_str(), 01777), 0);
  std::ostringstream csv;
  csv << "a,target\n";
  for (int i = 0; i < 16; ++i) csv << i % 4 << "," << i % 3 << "\n";
  writeFile(dir + "/data.csv", csv.str());
  const std::string lock = dir + "/.c.st.lock";
  ASSERT_EQ(runAsOtherUser(*user,
                           [&] {
                             writeFile(lock, "pid 1 on elsewhere\n");
                             return 0;
                           }),
            0);
  CommandResult r = runCohort({"train", "--data", "csv:" + dir + "/data.csv", "--loss", "mse", "--model", "mlp:1,1",
                               "--progress-every", "0", "--checkpoint", dir + "/c.st", "--resume"},
                              {.timeout = std::chrono::seconds(60)});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find(lock + " is owned by "), std::string::npos) << r.describe();
  EXPECT_NE(r.stderrText.find("uid " + std::to_string(user->uid) + "), not you"), std::string::npos) << r.describe();
  EXPECT_EQ(r.stdoutText.find("epoch 1/"), std::string::npos) << "nothing was trained\n" << r.describe();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cohort::testing
