// How `cohort train` answers SIGUSR1, SIGTERM and SIGHUP (docs/launcher.md).
//
// SIGUSR1 (SLURM sends it before the time limit with --signal=USR1@SECONDS; cohortrun forwards it),
// SIGTERM (cohortrun's stop, a scheduler's, `kill`) and SIGHUP (the terminal closed) ask the training
// loop to checkpoint and stop cleanly, as docs/launcher.md says workers do. A second SIGTERM or
// SIGHUP ends the worker at once (exit 128 + the signal): a worker stuck where the loop cannot see
// the request still leaves when asked twice. After a stop on SIGTERM or SIGHUP the worker exits
// 128 + that signal (so a shell or scheduler sees it was stopped), after one on SIGUSR1 with 0
// (SLURM requeues on the RESULT line's stopped=signal). The flags (StopSignals) are the program's;
// the library has none.
//
// Before the Trainer stands (StopSignals::trainingReady: the data opened, the ranks met, their settings agreed)
// there is nothing to checkpoint and the loop that would see a request has not started: a rank
// waiting there for peers that never come would sit out the whole --timeout (issue 44, item 17).
// There SIGTERM and SIGHUP end the worker at once with 128 + the signal, as their default action
// would, leaving what a killed worker leaves (its roster slot names it as gone to its peers; names
// in shared memory are removed by cohortrun's sweep or the next job of the id). SIGUSR1 still asks
// the loop to stop at its first step.
//
// The signals are never delivered to a training thread: they are blocked before any thread exists
// (every thread inherits the mask) and taken by one thread of its own with sigwait(). A handler
// running on a training thread's stack corrupted the heap: Debian's oneDNN 2.6 sgemm kernels keep
// data below the stack pointer, beyond the red zone, where the kernel writes the signal frame (seen
// as "corrupted size vs. prev_size" aborts and SIGSEGVs in cli_allreduce_test's SIGUSR1 case;
// valgrind shows oneDNN reading below its stack pointer).
#pragma once

#include <atomic>

namespace cohort::cli {

// The program's answer to the signals, shared with its training loop (never the library's).
struct StopSignals {
  std::atomic<bool> requested{false};      // the loop should checkpoint and stop
  std::atomic<int> signal{0};              // the signal that asked to stop (the last one)
  std::atomic<int> terminating{0};         // SIGTERM or SIGHUP, once one has asked
  std::atomic<bool> trainingReady{false};  // the Trainer is made: a stop request is honoured
  // Hogwild across nodes: the workers meet only at an epoch's end (train::Trainer::stopVoteDue), so
  // a stop is honoured there, and the answer to the signal says so.
  std::atomic<bool> stopsAtEpochEnd{false};
};

// Blocks the three signals in this thread (call it before any other thread exists, so that every
// thread inherits the mask) and starts the thread that takes them; returns the process's flags.
// Once per process.
StopSignals& installStopSignals();

}  // namespace cohort::cli
