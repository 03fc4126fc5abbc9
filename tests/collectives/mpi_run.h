// runMpirun: runs a program under /usr/bin/mpirun for the mpi tests and collects its output.
//
// The job gets OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM) (tests may run as root), --oversubscribe (more ranks
// than cores) and the parent's environment minus the variables that would make mpirun or the
// workers believe they are part of another job (OMPI_COMM_WORLD_*, RANK, WORLD_SIZE, SLURM_*, ...).
// mpirun runs in its own process group; at the deadline the whole group (mpirun, orted helpers and
// ranks) is killed with SIGKILL and the result says timedOut. A process of the job still holding
// the output 5 s after mpirun exited is killed too, and the result says outlived (and so does a
// line at the end of the output). stdout and stderr arrive merged
// through one pipe. Thread safety: one call at a time per process.
//
//   MpirunResult r = runMpirun({.ranks = 2, .argv = {workerPath(), "--scenario", "ok"}});
//   EXPECT_EQ(r.exitCode, 0) << r.output;
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "tests/support/process.h"

namespace cohort::collectives::testing {

struct MpirunOptions {
  int ranks = 2;
  std::vector<std::string> argv;  // the program (an absolute path) and its arguments
  std::chrono::seconds timeout{120};
};

struct MpirunResult {
  int exitCode = -1;  // mpirun's exit status; -1 when it was killed
  bool timedOut = false;
  bool outlived = false;  // a process of the job outlived mpirun by 5 s (killed)
  double seconds = 0;
  std::string output;  // stdout and stderr of mpirun and all ranks, merged
};

MpirunResult runMpirun(const MpirunOptions& options);

// The absolute path of a file in this test's runfiles (tests/support/process.h).
using cohort::testing::runfile;

}  // namespace cohort::collectives::testing
