// ProcessMemory: the figures of /proc/self/status, parsed exactly from a sample, errors that name
// the missing line, and the live process: the parts add up to the resident size, and touching
// 64 MiB of fresh memory shows up as private (anonymous) memory and in the peak.
#include "runtime/process_memory.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
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

}  // namespace
}  // namespace cohort::runtime
