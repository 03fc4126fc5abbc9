// LaunchPlan: what `cohortrun` is asked to do (docs/launcher.md), validated, with every worker's
// environment.
//
//   cohortrun --nproc-per-node N [--max-restarts R] [--log-dir DIR] [--grace-period S]
//             [--bind auto|cores|none] [--mps [--mps-timeout S]] -- PROGRAM ARGS…
//
// addLaunchFlags() declares the flags on a CLI11 app, writing into LaunchFlags the caller owns;
// checkSeparator() refuses a PROGRAM whose flags came without `--` before it; makeLaunchPlan()
// validates the flags (InvalidArgument, exit code 2) and fixes the job id and the base
// environment. environmentFor() gives the exact environment of one worker: the launcher's own minus
// any inherited rank variables, plus RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, COHORT_JOB_ID,
// COHORT_RESTART_COUNT, and OMP_NUM_THREADS=1 unless the launcher's environment sets it; and
// COHORT_PROGRESS=live when cohortrun's stdout is a terminal (liveStatus; see below). With --mps
// the Supervisor adds the job's own MPS variables (MpsDaemon::environment()); inherited ones are
// dropped from the base environment.
// A value type; thread safety as for any const object.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace cohort::launcher {

struct LaunchFlags {
  int nprocPerNode = 0;
  int maxRestarts = 0;
  std::string logDir;
  double gracePeriodS = 5.0;
  std::string bind = "auto";         // auto | cores | none
  bool mps = false;                  // start a private MPS control daemon for the job
  double mpsTimeoutS = 10.0;         // each wait on that daemon
  std::vector<std::string> command;  // PROGRAM ARGS…
};

// Also makes everything from PROGRAM on the worker's (CLI11's positionals_at_end), with or without
// `--` before it, so that checkSeparator() sees the whole worker command.
void addLaunchFlags(CLI::App& app, LaunchFlags& flags);

// Throws InvalidArgument when PROGRAM came without `--` before it and one of its arguments looks
// like a flag: without the separator cohortrun would refuse it as unknown ("--mode was not
// expected") or take it as its own (--log-dir). The message shows `args` with `--` put in place.
// `args`: cohortrun's arguments after argv[0]; `flags`: what addLaunchFlags() read from them, also
// after a failed parse (a forgotten `--` is the likeliest cause of one).
void checkSeparator(const std::vector<std::string>& args, const LaunchFlags& flags);

struct LaunchPlan {
  int worldSize = 1;  // single node: also the local world size
  int maxRestarts = 0;
  std::string logDir;  // empty: no log files
  std::chrono::milliseconds gracePeriod{5000};
  std::vector<std::string> command;
  std::string jobId;  // the same for every restart of the job
  // The launcher's environment ("NAME=value") minus the variables environmentFor() sets, with
  // COHORT_PROGRESS as liveStatus says.
  std::vector<std::string> baseEnvironment;
  // The CPUs each rank is bound to (--bind); empty: not bound.
  std::vector<std::vector<int>> cpusOfRank;
  // cohortrun's stdout is a terminal: rank 0's live progress is shown as a status line there
  // (OutputPump), so the workers get COHORT_PROGRESS=live (train/observe/progress.h) unless the user set
  // COHORT_PROGRESS=plain or off, which pass through. An inherited "live" (a cohortrun inside a
  // worker) or any other value is the launcher's to set: dropped when the status line is off.
  bool liveStatus = false;
  // --mps: the Supervisor runs an MpsDaemon (launcher/mps_daemon.h) in jobDirectory for the whole
  // job, with mpsTimeout for each of its waits.
  bool mps = false;
  std::chrono::milliseconds mpsTimeout{10000};
  // ${TMPDIR:-/tmp}/cohortrun-<jobId>: the prefix of the job's directory for its files (the MPS
  // daemon's), <prefix>-XXXXXX, made with mkdtemp only when needed (so that no other user can make
  // it first) and removed at the end of the job.
  std::string jobDirectory;
  // Said once before the first attempt ("cohortrun: " + mpsNote) unless empty: mps_probe.h.
  std::string mpsNote;

  std::vector<std::string> environmentFor(int rank, int restartCount) const;
};

struct PlanInputs {
  std::string jobId;
  std::vector<std::string> environment;  // "NAME=value" entries, e.g. currentEnvironment()
  std::vector<int> allowedCpus;          // e.g. allowedCpus(): the CPUs cohortrun may use
  bool stdoutIsTerminal = false;         // e.g. stdoutIsTerminal(): show a status line
  std::string mpsNote{};                 // e.g. mpsNote() (launcher/mps_probe.h)
};

// Whether cohortrun's stdout is a terminal that can show a status line: isatty(1) and TERM is not
// "dumb" (no "erase to end of line"), as train/observe/progress.h decides for a worker.
bool stdoutIsTerminal();

// The CPUs this process may run on (sched_getaffinity), in increasing order.
std::vector<int> allowedCpus();

// Throws InvalidArgument (naming the flag) for N < 1, R < 0, S <= 0 (either S) or a missing PROGRAM.
LaunchPlan makeLaunchPlan(const LaunchFlags& flags, const PlanInputs& inputs);

// This process's environment as "NAME=value" entries.
std::vector<std::string> currentEnvironment();

}  // namespace cohort::launcher
