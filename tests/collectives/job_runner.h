// Helpers for the collectives tests: binaries from the runfiles, fresh temporary directories, a
// program (cohortrun) run to its end with a timeout and its output collected, and forked children.
// Every wait has a timeout: a job or child that outlives it is SIGKILLed and reported.
// Thread safety: none; one test thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "tests/ipc/multiproc.h"
#include "tests/support/process.h"

namespace cohort::collectives::testing {

// The absolute path of a file in this test's runfiles (tests/support/process.h).
using cohort::testing::runfile;
// A new empty directory under $TEST_TMPDIR (or /tmp).
std::string freshDir(const std::string& tag);
// True when `dir` holds no entries; `listing` gets their names otherwise.
bool dirIsEmpty(const std::string& dir, std::string* listing = nullptr);
// Lines of `text` containing `needle`.
using cohort::testing::linesWith;

struct JobResult {
  int exitCode = -1;  // -1 when a signal ended it or it timed out
  int signal = 0;
  bool timedOut = false;
  std::string output;  // stdout and stderr, interleaved
  double seconds = 0;
};

// Runs argv (argv[0] a path) with this environment plus `extraEnv` ("NAME=value") and without
// job variables (RANK, WORLD_SIZE, LOCAL_*, COHORT_JOB_ID, COHORT_RESTART_COUNT).
JobResult runJob(const std::vector<std::string>& argv, const std::vector<std::string>& extraEnv,
                 std::chrono::milliseconds timeout);

// Starts argv like runJob but returns at once: its output goes to `outputPath`; reap it with
// waitChild().
pid_t spawnJob(const std::vector<std::string>& argv, const std::vector<std::string>& extraEnv,
               const std::string& outputPath);
std::string readFile(const std::string& path);

// Forking children and waiting for them with a timeout: the ipc tests' helpers (tests/ipc/multiproc.h).
using ipc::testing::forkChild;
using ipc::testing::waitChild;

}  // namespace cohort::collectives::testing
