#include "runtime/error.h"

#include <cstdio>
#include <cstdlib>

#include "runtime/world_info.h"

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
