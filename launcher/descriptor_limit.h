// DescriptorLimit: whether `ulimit -n` leaves cohortrun the file descriptors a job of N workers
// needs, checked before anything is opened, so that a low limit is a usage error naming both
// numbers (exit 2) instead of an internal error from pipe2() halfway through starting the workers.
//
// What cohortrun holds (descriptorsNeeded): what is open when it checks (stdin, stdout, stderr and
// whatever it inherited), its signalfd, two pipe read ends per worker (stdout, stderr), a log file
// per worker with --log-dir, while a worker starts five more (the write ends, the exec-error pipe,
// /dev/null), and a few for the job's roster, the sweep of stale segments and the MPS daemon
// (kDescriptorMargin). Like torchrun's and mpirun's hosts, it first raises its soft limit to the hard
// limit when the soft one is too low; its workers inherit the raised limit.
// Thread safety: call from the main thread before the Supervisor exists.
#pragma once

namespace cohort::launcher {

struct DescriptorNeedOptions {
  int workers = 1;
  bool logFiles = false;  // --log-dir: one file per worker
};

// For the roster, a directory being swept and the MPS daemon's input and output.
constexpr int kDescriptorMargin = 6;

// The descriptors a job needs, given `openNow` already open.
int descriptorsNeeded(const DescriptorNeedOptions& options, int openNow);

// Raises the soft RLIMIT_NOFILE up to the hard limit when it is below what the job needs; throws
// InvalidArgument ("this job needs 23 file descriptors for 4 worker(s) ...") when even the hard
// limit is too low.
void ensureDescriptors(const DescriptorNeedOptions& options);

}  // namespace cohort::launcher
