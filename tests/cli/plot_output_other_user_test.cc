// The plot's image on a shared machine (issue 44 item 5): its temporary had a predictable name
// ("<out>.tmp.<pid>") and cairo opened it following links, so a symbolic link another user planted
// there made the victim overwrite one of its own files with the PNG. writePlot is called in this
// process, whose pid the attacker (a second local user, tests/support/other_user.h) knows.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/plot.h"
#include "tests/support/other_user.h"

namespace cohort::cli {
namespace {

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(PlotOutputOtherUserTest, LinksPlantedWhereTheTemporaryGoesAreNeverWrittenThrough) {
  std::string why;
  auto user = testing::otherUser(&why);
  if (!user) GTEST_SKIP() << why;
  std::string dir = "/tmp/plot_other_XXXXXX";  // reachable by the other user, unlike TEST_TMPDIR
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  ASSERT_EQ(::chmod(dir.c_str(), 01777), 0);
  const std::string metrics = dir + "/m.jsonl", victim = dir + "/victim.txt";
  std::ofstream(metrics) << "{\"epoch\":1,\"step\":10,\"train_loss\":1.5,\"run_samples_per_s\":1}\n"
                            "{\"epoch\":2,\"step\":20,\"train_loss\":0.5,\"run_samples_per_s\":1}\n";
  std::ofstream(victim) << "the victim's own file\n";
  const mode_t oldUmask = ::umask(022);
  for (const std::string name : {"out.png", "out.svg"}) {
    const std::string out = dir + "/" + name, pid = std::to_string(::getpid());
    ASSERT_EQ(testing::runAsOtherUser(
                  *user,
                  [&] {
                    for (const std::string& tmp : {out + ".tmp." + pid, dir + "/." + name + ".tmp." + pid}) {
                      if (::symlink(victim.c_str(), tmp.c_str()) != 0) return 1;
                    }
                    return 0;
                  }),
              0);
    writePlot(metrics, {.outputPath = out});
    EXPECT_EQ(readText(victim), "the victim's own file\n") << "the plot was written through the planted link";
    struct stat st {};
    ASSERT_EQ(::lstat(out.c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_uid, ::geteuid());
    EXPECT_EQ(st.st_mode & 07777, 0644u);  // 0666 less the umask: the user's image to share
    const std::string image = readText(out);
    EXPECT_TRUE(image.rfind("\x89PNG", 0) == 0 || image.find("<svg") != std::string::npos) << image.substr(0, 40);
    EXPECT_TRUE(std::filesystem::is_symlink(out + ".tmp." + pid)) << "the attacker's link is left as it was";
  }
  ::umask(oldUmask);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cohort::cli
