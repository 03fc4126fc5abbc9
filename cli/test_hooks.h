// The test hooks of `cohort train` (train/test_hooks.h), read from the COHORT_TEST_* environment
// variables: the one place in Cohort that reads them, so that a test reaches every rank of a
// launched job alike while the library takes the hooks only as options.
//   COHORT_TEST_SLOW_BACKWARD="RANK:MS"      that rank sleeps MS in each backward
//   COHORT_TEST_SAMPLE_LOG=DIR               every rank logs the samples it trains on
//   COHORT_TEST_CLOCK_SKEW="RANK:SECONDS"    that rank's trace clock reads SECONDS ahead (0 to 1e6)
//   COHORT_TEST_AVERAGE_LOG=DIR              Hogwild across nodes: the leaders log each average
//   COHORT_TEST_MPI_MISMATCH="RANK:SEQUENCE" that rank's mpi collective #SEQUENCE has one element fewer
//   COHORT_TEST_MEMORY_AVAILABLE=BYTES       the memory floor's limit for the node's workers instead of
//                                            the machine's (cli/memory_estimate.h): a refusal a test can
//                                            place between two stages' figures on any machine
// A malformed value is an InvalidArgument naming the variable and the expected form.
#pragma once

#include <cstddef>

#include "train/test_hooks.h"

namespace cohort::cli {

train::TestHooks testHooksFromEnvironment();
// COHORT_TEST_MEMORY_AVAILABLE's bytes; 0 when unset.
size_t testMemoryAvailableFromEnvironment();

}  // namespace cohort::cli
