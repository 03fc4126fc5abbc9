// Timeouts given in seconds by users (--timeout, --grace-period, options structs): every wait in
// Cohort is bounded (docs/architecture.md, "The decisions that shape everything", item 5), so a
// timeout is a duration added to "now". A huge value (or inf) means "wait very long" and saturates
// at kLongestWait, which still fits in a steady_clock time point (adding milliseconds::max() to
// now() would overflow and time out at once). Thread safety: pure functions.
#pragma once

#include <chrono>
#include <cmath>
#include <string>

#include "runtime/error.h"

namespace cohort::runtime {

// About 100 years: far beyond any job, far below the clock's range (2^63 ns is 292 years).
inline constexpr std::chrono::milliseconds kLongestWait{100LL * 365 * 24 * 3600 * 1000};

// `timeout`, capped at kLongestWait.
inline std::chrono::milliseconds saturateTimeout(std::chrono::milliseconds timeout) {
  return timeout > kLongestWait ? kLongestWait : timeout;
}

// Seconds as a timeout, rounded up to whole milliseconds and capped at kLongestWait (inf included);
// InvalidArgument naming `what` (e.g. "--timeout") for zero, a negative value or NaN.
inline std::chrono::milliseconds timeoutFromSeconds(double seconds, const std::string& what) {
  if (!(seconds > 0)) COHORT_THROW(InvalidArgument) << what << " must be a positive number of seconds, got " << seconds;
  const double ms = std::ceil(seconds * 1000.0);
  if (!(ms < static_cast<double>(kLongestWait.count()))) return kLongestWait;
  return std::chrono::milliseconds(static_cast<int64_t>(ms));
}

}  // namespace cohort::runtime
