// ProcessBarrier: a barrier for the processes of one node, living in shared memory.
//
// The barrier's state is a block of caller-provided shared memory (e.g. inside a ShmRegion) of
// bytesFor(numRanks) bytes, 64-byte aligned: a small control block, a failure record (who gave up
// and why, see abandon()), then one 64-byte slot per rank holding, as lock-free
// std::atomic<uint64_t>, the barrier generation the rank has reached and its pid and start time.
// There is no mutex: a process that dies anywhere cannot leave anything locked.
//
// Algorithm: rank r arrives at generation g = slot[r].generation + 1 by storing g (release); it
// waits until every slot holds >= g (acquire). No rank can reach g + 1 before all have reached g, so
// counters never need resetting. While waiting it spins briefly, then sleeps with growing backoff
// (up to 10 ms); every ~20 ms it checks the pids of ranks that have not arrived: a registered rank
// whose process is gone (or a zombie) is a PeerError within ~100 ms; the deadline passing is a
// TimeoutError that lists the ranks that did not arrive. The last rank to arrive passes at once and
// may then exit or give up, while slower ranks still wait: so a waiter judges a rank (its process,
// a recorded failure) before it reads the arrivals, and a barrier that completed never fails.
// A rank that fails elsewhere (e.g. its wait on the network ran out) calls abandon() with its error
// before it unwinds: every rank waiting here, now or later, then fails at once with that rank's
// reason (the same exit code) instead of timing out on it and naming a rank that was only waiting
// itself. The first abandon() is kept.
//
// Order of calls: one process calls initialize() on the memory before any other process attaches
// (e.g. before publishing the ShmRegion); each rank then constructs a ProcessBarrier view on the
// same memory, calls registerRank(rank) (so its death is detectable), and all ranks call
// arriveAndWait() the same number of times, each with its own rank. Rank numbers are 0..numRanks-1.
//
// Ownership: a ProcessBarrier is a non-owning view; the memory must outlive it.
// Thread safety: each rank's calls must come from one thread at a time; different ranks may be
// threads of one process or separate processes.
//
//   ProcessBarrier::initialize(mem, ProcessBarrier::bytesFor(n), n);   // creator, once
//   ProcessBarrier barrier(mem, ProcessBarrier::bytesFor(n));           // every rank
//   barrier.registerRank(rank);
//   barrier.arriveAndWait(rank, {.what = "start", .timeout = std::chrono::seconds(30)});
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "runtime/error.h"

namespace cohort::ipc {

class ProcessBarrier {
 public:
  static constexpr int kMaxRanks = 1024;
  static constexpr size_t kAlignment = 64;

  // The windows in which wait() can race with the other ranks (see WaitOptions::testHook).
  enum class WaitPoint {
    kRankMissing,     // wait() has found `rank` missing, before it reports another rank's failure
    kProcessUnknown,  // the liveness check has found `rank` missing, before it looks at its process
  };

  struct WaitOptions {
    std::string what = "barrier";  // names the barrier in errors: "barrier 'start' timed out ..."
    std::chrono::milliseconds timeout{std::chrono::seconds(60)};
    // Test-only: called inside each WaitPoint's window with the rank concerned, so that a test can
    // make the other ranks move there (tests/ipc/barrier_test.cc). Empty otherwise: one branch.
    std::function<void(WaitPoint point, int rank)> testHook = nullptr;
  };

  // Bytes of shared memory a barrier for numRanks (1..kMaxRanks) needs.
  static size_t bytesFor(int numRanks);
  // Lays out a fresh barrier for numRanks in `memory` (64-byte aligned, >= bytesFor(numRanks)).
  // Call once, before any process constructs a view on it.
  static void initialize(void* memory, size_t bytes, int numRanks);

  // A view on a barrier initialised by initialize(); IoError when `memory` does not hold one.
  ProcessBarrier(void* memory, size_t bytes);

  int numRanks() const;
  // Records the calling process's pid and start time as `rank`'s, so peers notice if it dies.
  // InvalidArgument when another live process has registered the same rank.
  void registerRank(int rank);

  // Marks `rank` arrived at its next generation and returns that generation (registers the rank).
  uint64_t arrive(int rank);
  // Waits until every rank has reached `generation`. Throws TimeoutError (names the missing ranks)
  // or PeerError (names a missing rank whose process is gone).
  void wait(int rank, uint64_t generation, const WaitOptions& options) const;
  void arriveAndWait(int rank, const WaitOptions& options) { wait(rank, arrive(rank), options); }

  // `rank` gives up with `error` (its message and exit code): every wait() of another rank, now and
  // later, for a generation not yet complete throws "local rank R failed: <message>" as a
  // TimeoutError when `error` is one, else as a PeerError. Only the first call on a barrier is
  // kept; long messages are cut.
  void abandon(int rank, const Error& error);
  // The generation `rank` has reached (for tests and diagnostics).
  uint64_t generationOf(int rank) const;

 private:
  struct Control;
  struct Failure;
  struct Slot;
  Slot& slot(int rank) const;
  void checkRank(int rank) const;
  // The lowest rank below `generation`, or -1 when every rank has reached it.
  int firstMissing(uint64_t generation) const;
  // Fills `missing` with the ranks below `generation`; returns its size.
  int missingRanks(uint64_t generation, std::string& missing) const;
  void checkPeersAlive(int rank, uint64_t generation, const WaitOptions& options) const;
  // Whether a rank other than `rank` has recorded a failure; throwAbandoned() throws it.
  bool abandonedByOther(int rank) const;
  [[noreturn]] void throwAbandoned(int rank, const WaitOptions& options) const;

  Control* control_;
  Failure* failure_;
  Slot* slots_;
};

}  // namespace cohort::ipc
