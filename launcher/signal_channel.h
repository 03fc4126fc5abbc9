// SignalChannel: delivers signals to the poll loop as readable data on a descriptor (signalfd), so
// no work ever happens in a signal handler.
//
// The constructor blocks the given signals in the calling thread (cohortrun has only one) and opens a
// non-blocking, close-on-exec signalfd for them; the destructor closes it and restores the previous
// signal mask. Blocked signals stay blocked across fork and exec, so a child must call
// unblockAllSignalsInChild() before exec (it is async-signal-safe). Standard signals do not queue:
// two SIGCHLDs may arrive as one, so a reader must check every child, not count signals.
// Ownership: owns the signalfd. Thread safety: none; create it in the main thread before any other.
#pragma once

#include <signal.h>

#include <string>
#include <vector>

#include "runtime/unique_fd.h"

namespace cohort::launcher {

class SignalChannel {
 public:
  explicit SignalChannel(const std::vector<int>& signals);  // throws cohort::Error on failure
  SignalChannel(const SignalChannel&) = delete;
  SignalChannel& operator=(const SignalChannel&) = delete;
  ~SignalChannel();

  int fd() const { return fd_.get(); }
  // The signals that arrived since the last call, in arrival order (non-blocking).
  std::vector<int> readPending();
  // Takes the default action of a job-control stop (SIGTSTP, SIGTTIN, SIGTTOU) that the channel
  // reported, though the channel keeps it blocked: the process stops here, and this returns once it
  // is continued (SIGCONT, which the channel then also reports when it is one of its signals). Returns
  // at once where the kernel discards the stop (the process group is orphaned: no shell could
  // continue it).
  void stopThisProcess(int signal);

 private:
  sigset_t previousMask_;
  runtime::UniqueFd fd_;
};

// For a forked child before exec: an empty signal mask.
void unblockAllSignalsInChild();

// "SIGKILL" for 9, etc.; "signal N" when the number has no name.
std::string signalName(int signal);

}  // namespace cohort::launcher
