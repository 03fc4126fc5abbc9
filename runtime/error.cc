#include "runtime/error.h"

#include <cstdio>
#include <cstdlib>
#include <new>

#include "runtime/world_info.h"

namespace cohort {

int runMain(const std::string& prefix, const std::function<int()>& body) {
  auto fail = [&](const char* what, ExitCode code) {
    std::fprintf(stderr, "%serror: %s\n", prefix.c_str(), what);
    return static_cast<int>(code);
  };
  try {
    return body();
  } catch (const Error& e) {
    return fail(e.what(), e.code());
  } catch (const std::bad_alloc&) {
    return fail("out of host memory", ExitCode::kOutOfMemory);
  } catch (const std::exception& e) {
    return fail(e.what(), ExitCode::kInternal);
  }
}

}  // namespace cohort

namespace cohort::detail {

CheckFailure::CheckFailure(const char* file, int line, const char* cond) {
  os_ << "[rank " << runtime::rankForMessages() << "] CHECK failed at " << file << ":" << line
      << ": " << cond << ": ";
}

CheckFailure::~CheckFailure() {
  std::fprintf(stderr, "%s\n", os_.str().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace cohort::detail
