// TestHooks: faults and records that tests inject into a training job, passed in options
// (JobOptions::testHooks: the Job hands them to its placements and communicators, the Trainer reads
// them from its job). The library never reads them from the environment: a program that wants them
// fills the struct. `cohort train` fills it from the
// COHORT_TEST_* variables (cli/test_hooks.h, the one place that reads them), so that tests reach
// every rank of a launched job the same way.
// Every hook is off by default (rank -1, empty directory).
#pragma once

#include <cstdint>
#include <string>

namespace cohort::train {

struct TestHooks {
  // That rank sleeps `ms` in each backward, so that tests can interrupt or lose a rank mid-step
  // (COHORT_TEST_SLOW_BACKWARD="RANK:MS").
  struct SlowBackward {
    int rank = -1;
    int ms = 0;
  } slowBackward = {};
  // Each rank appends "EPOCH SAMPLE" to DIR/samples.rank<R> for every sample it trains on
  // (COHORT_TEST_SAMPLE_LOG=DIR): tests check the data order across resumes.
  std::string sampleLogDir = {};
  // That rank's clock reads `seconds` ahead in the trace's clock measurement, as another node's clock
  // may, so that tests can check the offsets undo it (COHORT_TEST_CLOCK_SKEW="RANK:SECONDS", 0 to 1e6).
  struct ClockSkew {
    int rank = -1;
    double seconds = 0;
  } clockSkew = {};

  // Hogwild across nodes: each node's leader appends to DIR/average.rank<R> a line "average K DIGEST
  // rounds N" after the K-th full average and "loaded DIGEST" after a checkpoint was loaded
  // (train/placement/node_averaging.h; COHORT_TEST_AVERAGE_LOG=DIR).
  std::string averageLogDir = {};
  // On every mpi communicator of the job (sub-groups included), the process of world rank `rank`
  // issues its collective #sequence with one element fewer, as a rank with a bug would
  // (collectives::CommunicatorOptions::FaultInjection; COHORT_TEST_MPI_MISMATCH="RANK:SEQUENCE").
  struct MpiMismatch {
    int rank = -1;
    int64_t sequence = -1;
  } mpiMismatch = {};
  // The Trainer leaves the parameters' bf16 copy untrusted (nn/param_buffer.h, "The bf16 copy"):
  // each bf16 forward refreshes it, as in a loop of one's own, so that tests compare the two.
  bool untrustedHalfCopy = false;

  // The clock skew of `rank` in nanoseconds (0 unless it is the skewed rank).
  int64_t clockSkewNs(int rank) const {
    return rank == clockSkew.rank ? static_cast<int64_t>(clockSkew.seconds * 1e9) : 0;
  }
};

}  // namespace cohort::train
