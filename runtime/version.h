// The version of this build of Cohort: "MAJOR.MINOR.PATCH", read from the repository's VERSION file
// when the library is built (the one place that holds the number). `cohort --version` prints it, and
// the packages that scripts/install writes carry it (pkg-config, CMake, libcohort.so.MAJOR.MINOR).
// Before 1.0 each MINOR version may change the API and the ABI.
// Thread safety: returns a pointer to a constant string; any thread may call it.
//
//   std::printf("built against Cohort %s\n", cohort::version());
#pragma once

namespace cohort {

const char* version();

}  // namespace cohort
