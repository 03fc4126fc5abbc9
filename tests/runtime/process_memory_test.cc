// ProcessMemory: the figures of /proc/self/status, parsed exactly from a sample, errors that name
// the missing line, and the live process: the parts add up to the resident size, and touching
// 64 MiB of fresh memory shows up as private (anonymous) memory and in the peak.
// MemoryHeadroom (issue 44, item 16): on fake /proc and /sys/fs/cgroup trees, the least of
// MemAvailable and every cgroup limit less its usage — v2, v1, nested, "max", v1's unlimited.
#include "runtime/process_memory.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <string>

#include "runtime/error.h"

namespace cohort::runtime {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

const char kSample[] =
    "Name:\tcohort\n"
    "VmPeak:\t  250000 kB\n"
    "VmHWM:\t   16508 kB\n"
    "VmRSS:\t   16400 kB\n"
    "RssAnon:\t    5092 kB\n"
    "RssFile:\t   11300 kB\n"
    "RssShmem:\t       8 kB\n"
    "Threads:\t2\n";

TEST(ProcessMemory, ParsesTheStatusFile) {
  const ProcessMemory m = parseProcStatus(kSample, "sample");
  EXPECT_EQ(m.peakResidentBytes, 16508 * size_t{1024});
  EXPECT_EQ(m.residentBytes, 16400 * size_t{1024});
  EXPECT_EQ(m.anonymousBytes, 5092 * size_t{1024});
  EXPECT_EQ(m.fileBytes, 11300 * size_t{1024});
  EXPECT_EQ(m.sharedMemoryBytes, 8 * size_t{1024});
}

TEST(ProcessMemory, AMissingOrMalformedLineIsAnIoErrorNamingIt) {
  std::string noShmem = kSample;
  noShmem.erase(noShmem.find("RssShmem"), std::strlen("RssShmem:\t       8 kB\n"));
  try {
    parseProcStatus(noShmem, "/proc/42/status");
    FAIL() << "no IoError";
  } catch (const IoError& e) {
    EXPECT_STREQ(e.what(), "/proc/42/status: no RssShmem line");
  }
  std::string pages = kSample;
  pages.replace(pages.find("16400 kB"), 8, "4100 pages");
  try {
    parseProcStatus(pages, "sample");
    FAIL() << "no IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read its VmRSS line"), std::string::npos) << e.what();
  }
}

TEST(ProcessMemory, ThePartsAddUpToTheResidentSize) {
  const ProcessMemory m = processMemory();
  EXPECT_GT(m.residentBytes, 0u);
  EXPECT_EQ(m.residentBytes, m.anonymousBytes + m.fileBytes + m.sharedMemoryBytes);  // one reading: exact
  EXPECT_GE(m.peakResidentBytes, m.residentBytes);
}

TEST(ProcessMemory, TouchedMemoryIsPrivateAndRaisesThePeak) {
  const size_t bytes = 64 * kMiB;
  const ProcessMemory before = processMemory();
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 1, bytes);
  const ProcessMemory touched = processMemory();
  munmap(p, bytes);
  const ProcessMemory after = processMemory();
  // A margin of 4 MiB: the kernel's counters are per-CPU and read approximately (the peak it keeps
  // at munmap can be a few hundred KiB below the resident size read just before), and other
  // threads of the test runner may allocate a little meanwhile.
  const size_t margin = 4 * kMiB;
  EXPECT_GE(touched.anonymousBytes, before.anonymousBytes + bytes - margin);
  EXPECT_GE(touched.peakResidentBytes, before.residentBytes + bytes - margin);
  EXPECT_LE(after.anonymousBytes + bytes - margin, touched.anonymousBytes);  // unmapped: gone again
  EXPECT_GE(after.peakResidentBytes + margin, touched.residentBytes);        // the peak stays
}

constexpr size_t kGiB = size_t{1} << 30;

// A fake /proc and /sys/fs/cgroup under a fresh directory.
class MemoryHeadroomTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/headroom.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    base_ = pattern;
    options_ = {.procRoot = base_ + "/proc", .cgroupRoot = base_ + "/cgroup"};
    write("/proc/meminfo", "MemTotal:       32000000 kB\nMemAvailable:   " + std::to_string(8 * kGiB / 1024) + " kB\n");
  }
  // Writes `text` to the fake tree's `path`, making its directories.
  void write(const std::string& path, const std::string& text) {
    const std::string full = base_ + path;
    for (size_t slash = full.find('/', 1); slash != std::string::npos; slash = full.find('/', slash + 1)) {
      ::mkdir(full.substr(0, slash).c_str(), 0700);
    }
    std::ofstream(full) << text;
  }
  std::string base_;
  MemoryHeadroomOptions options_;
};

TEST_F(MemoryHeadroomTest, WithoutALimitTheHostsMemAvailableApplies) {
  write("/proc/self/cgroup", "0::/\n");
  const MemoryHeadroom h = memoryHeadroom(options_);
  EXPECT_EQ(h.availableBytes, 8 * kGiB);
  EXPECT_EQ(h.cgroupPath, "");
  EXPECT_EQ(h.describe(), "the host's MemAvailable: 8.0 GiB");
}

TEST_F(MemoryHeadroomTest, AV2LimitLessItsUsageApplies) {
  write("/proc/self/cgroup", "0::/job.slice/step_0\n");
  write("/cgroup/job.slice/step_0/memory.max", std::to_string(3 * kGiB) + "\n");
  write("/cgroup/job.slice/step_0/memory.current", std::to_string(kGiB / 4) + "\n");
  const MemoryHeadroom h = memoryHeadroom(options_);
  EXPECT_EQ(h.availableBytes, 3 * kGiB - kGiB / 4);
  EXPECT_EQ(h.describe(), "the cgroup limit of " + options_.cgroupRoot + "/job.slice/step_0: 3.0 GiB, 0.2 GiB in use");
}

// The step's own cgroup says "max"; its parent (the job's allocation) has the limit.
TEST_F(MemoryHeadroomTest, AnAncestorsLimitApplies) {
  write("/proc/self/cgroup", "0::/job.slice/step_0\n");
  write("/cgroup/job.slice/step_0/memory.max", "max\n");
  write("/cgroup/job.slice/step_0/memory.current", std::to_string(kGiB) + "\n");
  write("/cgroup/job.slice/memory.max", std::to_string(2 * kGiB) + "\n");
  write("/cgroup/job.slice/memory.current", std::to_string(kGiB) + "\n");
  const MemoryHeadroom h = memoryHeadroom(options_);
  EXPECT_EQ(h.availableBytes, kGiB);
  EXPECT_EQ(h.cgroupPath, options_.cgroupRoot + "/job.slice");
}

// Of two nested limits, the one that leaves less: here the inner one, though the outer is smaller.
TEST_F(MemoryHeadroomTest, TheLimitThatLeavesTheLeastApplies) {
  write("/proc/self/cgroup", "0::/outer/inner\n");
  write("/cgroup/outer/memory.max", std::to_string(4 * kGiB));
  write("/cgroup/outer/memory.current", std::to_string(kGiB));
  write("/cgroup/outer/inner/memory.max", std::to_string(5 * kGiB));
  write("/cgroup/outer/inner/memory.current", std::to_string(3 * kGiB));
  EXPECT_EQ(memoryHeadroom(options_).availableBytes, 2 * kGiB);
  EXPECT_EQ(memoryHeadroom(options_).cgroupPath, options_.cgroupRoot + "/outer/inner");
}

TEST_F(MemoryHeadroomTest, AV1MemoryControllerLimitApplies) {
  write("/proc/self/cgroup", "9:pids:/\n4:memory:/process_api/abc\n0::/\n");
  write("/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");  // unlimited
  write("/cgroup/memory/process_api/abc/memory.limit_in_bytes", std::to_string(3 * kGiB) + "\n");
  write("/cgroup/memory/process_api/abc/memory.usage_in_bytes", std::to_string(kGiB) + "\n");
  const MemoryHeadroom h = memoryHeadroom(options_);
  EXPECT_EQ(h.availableBytes, 2 * kGiB);
  EXPECT_EQ(h.describe(),
            "the cgroup limit of " + options_.cgroupRoot + "/memory/process_api/abc: 3.0 GiB, 1.0 GiB in use");
}

// A container sees its own cgroup as the hierarchy's root while /proc/self/cgroup names the host's
// path, which does not exist there; a v1 controller listed with others; an unlimited v1 cgroup.
TEST_F(MemoryHeadroomTest, AContainersRootCgroupAppliesAndUnlimitedIsNoLimit) {
  write("/proc/self/cgroup", "3:cpu,memory:/docker/0123\n");
  write("/cgroup/memory/memory.limit_in_bytes", std::to_string(kGiB));
  write("/cgroup/memory/memory.usage_in_bytes", "0");
  EXPECT_EQ(memoryHeadroom(options_).availableBytes, kGiB);
  write("/cgroup/memory/memory.limit_in_bytes", "9223372036854771712");
  EXPECT_EQ(memoryHeadroom(options_).availableBytes, 8 * kGiB);
  EXPECT_EQ(memoryHeadroom(options_).cgroupPath, "");
}

// A hybrid system's v2 hierarchy under "unified"; usage past the limit leaves nothing, and says so.
TEST_F(MemoryHeadroomTest, AHybridSystemsUnifiedHierarchyIsReadAndAFullCgroupLeavesNothing) {
  write("/proc/self/cgroup", "0::/user.slice\n");
  write("/cgroup/unified/user.slice/memory.max", std::to_string(kGiB));
  write("/cgroup/unified/user.slice/memory.current", std::to_string(2 * kGiB));
  const MemoryHeadroom h = memoryHeadroom(options_);
  EXPECT_TRUE(h.known());
  EXPECT_EQ(h.availableBytes, 0u);
  EXPECT_EQ(h.cgroupPath, options_.cgroupRoot + "/unified/user.slice");
}

TEST_F(MemoryHeadroomTest, NothingReadableIsUnknown) {
  const MemoryHeadroom h =
      memoryHeadroom({.procRoot = options_.procRoot + "/missing", .cgroupRoot = options_.cgroupRoot});
  EXPECT_FALSE(h.known());
}

}  // namespace
}  // namespace cohort::runtime
