// Waiter: how the shm backend's progress thread waits for its peers' counters in the job segment.
//
// A wait first spins (kSpins pause iterations: a peer usually publishes within microseconds), then
// sleeps on the peer's futex word RankSlot::bell (FUTEX_WAIT, at most kSleepSlice at a time; the
// publisher bumps the bell and calls FUTEX_WAKE when someone sleeps on it, see ring()). Every
// kLivenessInterval while sleeping it checks that every peer's registered process still exists, so a
// dead rank is a PeerError within ~30 ms (plus up to 300 ms for its parent to reap it, so a
// launcher sees the dead rank before this one's exit); the collective's deadline passing is a TimeoutError that
// names the sequence number, the collective and the ranks that had not arrived.
// Thread safety: one Waiter per progress thread; ring() may be called from any thread.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "collectives/communicator.h"
#include "collectives/shm/shm_layout.h"

namespace cohort::collectives::shm {

class Waiter {
 public:
  static constexpr int kSpins = 2000;
  static constexpr std::chrono::microseconds kSpinTime{30};

  Waiter(RankSlot* slots, int numRanks, int rank) : slots_(slots), numRanks_(numRanks), rank_(rank) {}

  // Starts the clock for one collective (its fingerprint names it in errors, formatted only then).
  void begin(const Fingerprint& fingerprint, std::chrono::milliseconds timeout);

  // Returns once ready(q) holds; `stage` says what q should have done ("stage its input").
  template <class Ready>
  void waitRank(int q, Ready ready, const char* stage) {
    // At most kSpins pauses and at most kSpinTime: a pause costs ~140 cycles on recent Xeons, and
    // on an oversubscribed machine spinning only delays the peer we wait for.
    const auto spinUntil = std::chrono::steady_clock::now() + kSpinTime;
    for (int i = 0; i < kSpins; ++i) {
      if (ready(q)) return;
      __builtin_ia32_pause();
      if (i % 64 == 63 && std::chrono::steady_clock::now() >= spinUntil) break;
    }
    // By reference: a std::function of a reference_wrapper never allocates (a copy of a lambda
    // with more than two captures would, on every slow wait).
    std::function<bool(int)> check = std::ref(ready);
    while (!sleepOnce(q, check, stage)) {
    }
  }

  // Returns once ready(q) holds for every rank q other than this one.
  template <class Ready>
  void waitAll(Ready ready, const char* stage) {
    for (int q = 0; q < numRanks_; ++q) {
      if (q != rank_) waitRank(q, ready, stage);
    }
  }

  // Publishes a change of `slot` (after its counters were stored with release order).
  static void ring(RankSlot& slot);

 private:
  // One slow-path step: true when ready(q) holds; else sleeps a slice, checks peers and deadline.
  bool sleepOnce(int q, const std::function<bool(int)>& ready, const char* stage);
  void checkPeersAlive(const std::function<bool(int)>& ready, const char* stage) const;
  [[noreturn]] void throwTimeout(const std::function<bool(int)>& ready, const char* stage) const;

  RankSlot* slots_;
  int numRanks_;
  int rank_;
  Fingerprint fingerprint_;
  std::chrono::milliseconds timeout_{0};
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::steady_clock::time_point nextLivenessCheck_;
};

}  // namespace cohort::collectives::shm
