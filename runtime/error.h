// Errors in three tiers (STYLE.md §4).
//
//  1. COHORT_CHECK(cond) << "context": a broken invariant, i.e. a bug in Cohort. It prints the rank,
//     file:line, the failed condition and the streamed context to stderr and aborts.
//  2. Typed exceptions derived from cohort::Error for what the environment or the user can cause.
//     Each carries the process exit code that docs/errors.md assigns to it.
//  3. Only the two mains (cli/ and launcher/) catch them and turn them into exit codes
//     (see exitCodeFor). Library code never calls exit().
//
// Thread safety: all types are value types; COHORT_CHECK is safe from any thread.
#pragma once

#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>

namespace cohort {

// Process exit codes, shared by `cohort` and `cohortrun` (docs/errors.md).
enum class ExitCode : int {
  kOk = 0,
  kInternal = 1,
  kUsage = 2,
  kTimeout = 3,
  kPeerFailed = 4,
  kOutOfMemory = 5,
  kDiverged = 6,  // training met a non-finite loss or gradient (train::Diverged)
  kInterrupted = 130,
  kTerminated = 143,
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, ExitCode code = ExitCode::kInternal)
      : std::runtime_error(what), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// Bad flags, model specs, shapes or values supplied by the user.
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& what) : Error(what, ExitCode::kUsage) {}
};

// A file that is missing, unreadable, truncated or corrupt. The message names the file and, where
// known, the offset or line.
class IoError : public Error {
 public:
  explicit IoError(const std::string& what) : Error(what, ExitCode::kUsage) {}
};

// A wait ran out; the message names what was missing (which ranks, which key, which collective).
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what) : Error(what, ExitCode::kTimeout) {}
};

// Another rank failed or vanished.
class PeerError : public Error {
 public:
  explicit PeerError(const std::string& what) : Error(what, ExitCode::kPeerFailed) {}
};

// Host or device memory could not be allocated.
class OutOfMemory : public Error {
 public:
  explicit OutOfMemory(const std::string& what) : Error(what, ExitCode::kOutOfMemory) {}
};

// The one place exceptions become exit codes (tier 3): runs `body`, and for what it throws prints
// "<prefix>error: <what>" as one line on stderr and returns the exception's exit code (OutOfMemory
// for std::bad_alloc, kInternal for anything else). For the programs' mains only.
int runMain(const std::string& prefix, const std::function<int()>& body);

// Builds a message with operator<< and throws it as E when the builder goes out of scope.
//   COHORT_THROW(IoError) << path << ": truncated at byte " << offset;
namespace detail {
template <class E>
class Thrower {
 public:
  template <class T>
  Thrower& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  [[noreturn]] ~Thrower() noexcept(false) { throw E(os_.str()); }

 private:
  std::ostringstream os_;
};

// Prints "[rank R] CHECK failed at file:line: cond: context" and aborts.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond);
  template <class T>
  CheckFailure& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  [[noreturn]] ~CheckFailure();

 private:
  std::ostringstream os_;
};
}  // namespace detail

}  // namespace cohort

#define COHORT_THROW(E) ::cohort::detail::Thrower<::cohort::E>()

#define COHORT_CHECK(cond) \
  if (__builtin_expect(!!(cond), 1)) {} else ::cohort::detail::CheckFailure(__FILE__, __LINE__, #cond)

#define COHORT_CHECK_EQ(a, b) COHORT_CHECK((a) == (b)) << (a) << " vs " << (b) << " "
