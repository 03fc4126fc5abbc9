#include "cli/test_hooks.h"

#include <cstdio>
#include <cstdlib>

#include "runtime/error.h"

namespace cohort::cli {

namespace {

// "RANK:VALUE" with nothing after it; false when malformed.
bool parseRankValue(const char* text, int& rank, double& value) {
  int end = 0;
  return std::sscanf(text, "%d:%lf%n", &rank, &value, &end) == 2 && text[end] == '\0' && rank >= 0;
}

}  // namespace

train::TestHooks testHooksFromEnvironment() {
  train::TestHooks hooks;
  if (const char* slow = std::getenv("COHORT_TEST_SLOW_BACKWARD")) {
    double ms = 0;
    if (!parseRankValue(slow, hooks.slowBackward.rank, ms) || !(ms >= 0 && ms <= 600000) ||
        ms != static_cast<int>(ms)) {
      COHORT_THROW(InvalidArgument) << "COHORT_TEST_SLOW_BACKWARD must be RANK:MS (MS a whole number to 600000), got '"
                                    << slow << "'";
    }
    hooks.slowBackward.ms = static_cast<int>(ms);
  }
  if (const char* dir = std::getenv("COHORT_TEST_SAMPLE_LOG"); dir && *dir) hooks.sampleLogDir = dir;
  if (const char* skew = std::getenv("COHORT_TEST_CLOCK_SKEW")) {
    train::TestHooks::ClockSkew& s = hooks.clockSkew;
    if (!parseRankValue(skew, s.rank, s.seconds) || !(s.seconds >= 0 && s.seconds < 1e6)) {
      COHORT_THROW(InvalidArgument) << "COHORT_TEST_CLOCK_SKEW must be RANK:SECONDS (0 to 1e6), got '" << skew << "'";
    }
  }
  if (const char* dir = std::getenv("COHORT_TEST_AVERAGE_LOG"); dir && *dir) hooks.averageLogDir = dir;
  if (const char* mismatch = std::getenv("COHORT_TEST_MPI_MISMATCH"); mismatch && *mismatch) {
    double sequence = 0;
    if (!parseRankValue(mismatch, hooks.mpiMismatch.rank, sequence) || !(sequence >= 0 && sequence < 1e15) ||
        sequence != static_cast<double>(static_cast<int64_t>(sequence))) {
      COHORT_THROW(InvalidArgument) << "COHORT_TEST_MPI_MISMATCH must be RANK:SEQUENCE, got '" << mismatch << "'";
    }
    hooks.mpiMismatch.sequence = static_cast<int64_t>(sequence);
  }
  return hooks;
}

size_t testMemoryAvailableFromEnvironment() {
  const char* text = std::getenv("COHORT_TEST_MEMORY_AVAILABLE");
  if (!text || !*text) return 0;
  unsigned long long bytes = 0;
  int end = 0;
  if (*text < '0' || *text > '9' || std::sscanf(text, "%llu%n", &bytes, &end) != 1 || text[end] != '\0' || bytes == 0) {
    COHORT_THROW(InvalidArgument) << "COHORT_TEST_MEMORY_AVAILABLE must be a number of bytes above 0, got '" << text
                                  << "'";
  }
  return static_cast<size_t>(bytes);
}

}  // namespace cohort::cli
