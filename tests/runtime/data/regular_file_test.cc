// runtime/data/regular_file.h: what a file-based dataset accepts (a regular file, through symbolic
// links) and how it refuses the rest (a directory, a character device, a FIFO, a missing path),
// one line naming the path. A FIFO is refused without waiting for a writer.
#include "runtime/data/regular_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "runtime/error.h"
#include "tests/runtime/data/test_util.h"

namespace cohort::runtime::data {
namespace {

using testing::freshTempDir;
using testing::messageOf;
using testing::writeFile;

TEST(RegularFile, ReadsEveryByteThroughLinksAndOfEmptyFiles) {
  const std::string dir = freshTempDir();
  std::string bytes;
  for (int i = 0; i < 200000; ++i) bytes += static_cast<char>(i * 31 % 251);  // past one 64 KiB chunk
  writeFile(dir + "/big.bin", bytes);
  EXPECT_TRUE(readRegularFile(dir + "/big.bin") == bytes);
  ASSERT_EQ(::symlink((dir + "/big.bin").c_str(), (dir + "/link.bin").c_str()), 0);
  EXPECT_TRUE(readRegularFile(dir + "/link.bin") == bytes);
  writeFile(dir + "/empty.bin", "");
  EXPECT_EQ(readRegularFile(dir + "/empty.bin"), "");
}

TEST(RegularFile, RefusesDirectoriesDevicesFifosAndMissingPaths) {
  const std::string dir = freshTempDir();
  EXPECT_EQ(messageOf<IoError>([&] { readRegularFile(dir); }), dir + ": is a directory, not a regular file");
  EXPECT_EQ(messageOf<IoError>([&] { readRegularFile("/dev/zero"); }),
            "/dev/zero: is a character device, not a regular file");
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);
  EXPECT_EQ(messageOf<IoError>([&] { openRegularFile(dir + "/fifo"); }),
            dir + "/fifo: is a FIFO or pipe, not a regular file");
  EXPECT_EQ(messageOf<IoError>([&] { readRegularFile(dir + "/missing"); }), dir + "/missing: no such file");
}

TEST(RegularFile, DirectoryRuleLetsMissingPathsThrough) {
  const std::string dir = freshTempDir();
  writeFile(dir + "/file", "x");
  EXPECT_NO_THROW(requireDirectoryIfPresent(dir, "hint"));
  EXPECT_NO_THROW(requireDirectoryIfPresent(dir + "/missing", "hint"));
  EXPECT_EQ(messageOf<IoError>([&] { requireDirectoryIfPresent(dir + "/file", "mnist:DIR wants DIR"); }),
            dir + "/file: is a regular file, not a directory; mnist:DIR wants DIR");
}

}  // namespace
}  // namespace cohort::runtime::data
