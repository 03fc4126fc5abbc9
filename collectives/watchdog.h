// CollectiveWatchdog: a backend's collectives that run asynchronously on a device (NCCL), watched
// from a thread of their own, because such a collective has no timeout of its own: a peer that dies
// or never arrives leaves its kernel spinning forever.
//
// The backend tells the watchdog about each collective as it issues it (track), with a probe that
// says whether it has finished (for NCCL: its completion event) and the fingerprint that names it.
// Every pollInterval the thread probes the outstanding ones, and asks the backend for an
// asynchronous error (ncclCommGetAsyncError). The first of
//   - a collective still pending `timeout` after it was issued,
//   - a probe or the backend reporting an error,
// moves the watchdog to failed, once: it records the error (TimeoutError naming the collective, its
// sequence number and the timeout; or PeerError with the backend's message), calls the abort hook
// (ncclCommAbort, which makes the stuck kernels return, so the streams and any host wait on them
// unblock), and stops probing. The issuing thread sees the error at its next track(),
// rethrowIfFailed() or Work::wait; after that the communicator is unusable, as every Communicator
// is after an error (communicator.h).
//
// State machine: running --(timeout | error)--> failed (terminal). Collectives that finish are
// dropped in any order. Hooks run on the watchdog thread only; none runs after the destructor
// returns. Thread safety: track/rethrowIfFailed/failed/pending from any thread.
//
//   CollectiveWatchdog watchdog({.probe = ..., .asyncError = ..., .abort = [&] { ncclCommAbort(comm); }},
//                               {.timeout = 30s, .rank = world.rank, .backend = "nccl"});
//   watchdog.track(fingerprint, [event] { return queryEvent(event); });
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "collectives/communicator.h"

namespace cohort::collectives {

class CollectiveWatchdog {
 public:
  enum class State { kPending, kDone, kFailed };
  struct Probe {
    State state = State::kPending;
    std::string error;  // with kFailed: what failed
  };
  using ProbeFn = std::function<Probe()>;

  struct Hooks {
    // The backend-wide asynchronous error, or "" (may be empty: no such check).
    std::function<std::string()> asyncError;
    // Called once, on the watchdog thread, when it fails (must not throw).
    std::function<void()> abort;
  };
  struct Options {
    std::chrono::milliseconds timeout{std::chrono::seconds(300)};
    std::chrono::milliseconds pollInterval{std::chrono::milliseconds(100)};
    int rank = 0;
    std::string backend = "nccl";  // for the messages
  };

  CollectiveWatchdog(Hooks hooks, Options options);
  // Stops the thread (without aborting anything still pending).
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // A collective just issued; its deadline is now + timeout. Throws the recorded error if failed.
  void track(const Fingerprint& fingerprint, ProbeFn probe);
  // Throws the recorded error (TimeoutError or PeerError) if the watchdog has failed.
  void rethrowIfFailed() const;
  bool failed() const;
  // Collectives tracked and not yet seen finished.
  size_t pending() const;
  const Options& options() const { return options_; }

 private:
  struct Entry {
    Fingerprint fingerprint;
    ProbeFn probe;
    std::chrono::steady_clock::time_point deadline;
  };
  void run();
  // One pass over the outstanding collectives; returns the exception to fail with, or null.
  std::exception_ptr poll();
  void fail(std::exception_ptr error);

  Hooks hooks_;
  Options options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Entry> entries_;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace cohort::collectives
