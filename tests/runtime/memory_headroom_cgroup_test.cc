// MemoryHeadroom in a real cgroup (issue 44, item 16): a process moved into a new memory cgroup
// limited to 512 MiB reads that limit, names the cgroup, and never more than it, though the host's
// MemAvailable is larger. Needs root and a writable cgroup hierarchy (v1's memory controller, or v2
// with the memory controller delegated to this process's cgroup); elsewhere it says why and skips.
// Outside Bazel's sandbox (tags no-sandbox), which mounts /sys/fs/cgroup read-only.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/process_memory.h"
#include "tests/support/memory_cgroup.h"

namespace cohort::runtime {
namespace {

constexpr size_t kLimit = size_t{512} << 20;

using cohort::testing::ownMemoryCgroup;
using cohort::testing::OwnMemoryCgroup;
constexpr auto writeFile = cohort::testing::writeCgroupFile;

TEST(MemoryHeadroomCgroup, AProcessInALimitedCgroupReadsItsLimit) {
  if (::geteuid() != 0) GTEST_SKIP() << "making a cgroup needs root";
  const MemoryHeadroom outside = memoryHeadroom();
  if (outside.availableBytes <= 2 * kLimit) GTEST_SKIP() << "this machine has too little memory for the test";
  const OwnMemoryCgroup own = ownMemoryCgroup();
  if (own.directory.empty()) GTEST_SKIP() << "no memory cgroup in /proc/self/cgroup";
  const std::string dir = own.directory + "/cohort-headroom-test-" + std::to_string(::getpid());
  if (::mkdir(dir.c_str(), 0700) != 0) GTEST_SKIP() << "cannot make " << dir << ": " << std::strerror(errno);
  if (!writeFile(dir + "/" + own.limitFile, std::to_string(kLimit))) {
    ::rmdir(dir.c_str());
    GTEST_SKIP() << "cannot limit " << dir << " (" << own.limitFile << "): " << std::strerror(errno);
  }
  int report[2];
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string text = "moved=0\n";
    if (writeFile(dir + "/cgroup.procs", "0")) {
      const MemoryHeadroom h = memoryHeadroom();
      text = "moved=1\n" + h.cgroupPath + "\n" + std::to_string(h.cgroupLimitBytes) + "\n" +
             std::to_string(h.availableBytes) + "\n";
    }
    (void)!::write(report[1], text.data(), text.size());
    ::_exit(0);
  }
  ::close(report[1]);
  std::string text;
  char buffer[512];
  for (ssize_t n; (n = ::read(report[0], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<size_t>(n));
  ::close(report[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ::rmdir(dir.c_str());  // empty again: the child has exited
  std::istringstream lines(text);
  std::string moved, path, limit, available;
  std::getline(lines, moved);
  if (moved != "moved=1") GTEST_SKIP() << "cannot move a process into " << dir;
  std::getline(lines, path);
  std::getline(lines, limit);
  std::getline(lines, available);
  EXPECT_EQ(path, dir) << text;
  EXPECT_EQ(limit, std::to_string(kLimit)) << text;
  EXPECT_LE(std::stoull(available), kLimit) << text;
}

}  // namespace
}  // namespace cohort::runtime
