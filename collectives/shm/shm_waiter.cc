#include "collectives/shm/shm_waiter.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>
#include <iomanip>
#include <sstream>
#include <thread>

#include "ipc/process_liveness.h"
#include "runtime/error.h"

namespace cohort::collectives::shm {

namespace {

constexpr auto kSleepSlice = std::chrono::milliseconds(5);
constexpr auto kLivenessInterval = std::chrono::milliseconds(20);
constexpr auto kReapGrace = std::chrono::milliseconds(300);

// FUTEX_WAIT (not the _PRIVATE variant: the word is shared between processes) for at most `slice`.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds slice) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(slice.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(slice.count() % 1000000000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// A killed multi-threaded process shows as a zombie while its other threads are still being torn
// down, before its parent can reap it. Give the parent (cohortrun) a moment to reap it first, so the
// launcher sees the dead rank before this rank's exit with code 4 and blames the right one.
void awaitReaped(pid_t pid) {
  const auto until = std::chrono::steady_clock::now() + kReapGrace;
  while (::kill(pid, 0) == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

void Waiter::begin(const Fingerprint& fingerprint, std::chrono::milliseconds timeout) {
  fingerprint_ = fingerprint;
  timeout_ = timeout;
  auto now = std::chrono::steady_clock::now();
  deadline_ = now + timeout;
  nextLivenessCheck_ = now + kLivenessInterval;
}

void Waiter::ring(RankSlot& slot) {
  // seq_cst on both sides (here and in sleepOnce) pairs the bell bump with the waiter count: either
  // the sleeper sees the new bell value and does not sleep, or this sees the sleeper and wakes it.
  slot.bell.fetch_add(1, std::memory_order_seq_cst);
  if (slot.waiters.load(std::memory_order_seq_cst) > 0) futexWakeAll(&slot.bell);
}

bool Waiter::sleepOnce(int q, const std::function<bool(int)>& ready, const char* stage) {
  RankSlot& slot = slots_[q];
  slot.waiters.fetch_add(1, std::memory_order_seq_cst);
  uint32_t seen = slot.bell.load(std::memory_order_seq_cst);
  bool isReady = ready(q);
  if (!isReady) {
    auto now = std::chrono::steady_clock::now();
    auto slice =
        std::min<std::chrono::nanoseconds>(kSleepSlice, std::max(deadline_ - now, std::chrono::nanoseconds(0)));
    if (slice.count() > 0) futexWait(&slot.bell, seen, slice);
  }
  slot.waiters.fetch_sub(1, std::memory_order_seq_cst);
  if (isReady || ready(q)) return true;
  auto now = std::chrono::steady_clock::now();
  if (now >= nextLivenessCheck_) {
    checkPeersAlive(ready, stage);
    nextLivenessCheck_ = now + kLivenessInterval;
  }
  if (now >= deadline_) throwTimeout(ready, stage);
  return false;
}

void Waiter::checkPeersAlive(const std::function<bool(int)>& ready, const char* stage) const {
  // Every peer, not only the awaited one: a rank that waits on a dead rank must blame the dead one,
  // not the live rank that is itself stuck behind it.
  for (int q = 0; q < numRanks_; ++q) {
    if (q == rank_) continue;
    uint64_t pid = slots_[q].pid.load(std::memory_order_acquire);
    if (pid == 0) continue;
    if (!ipc::processIsAlive(static_cast<pid_t>(pid), slots_[q].startTicks.load(std::memory_order_relaxed))) {
      awaitReaped(static_cast<pid_t>(pid));
      COHORT_THROW(PeerError) << "rank " << q << " (pid " << pid << ") died during collective " << fingerprint_.str()
                              << " (rank " << rank_ << " was waiting for ranks to " << stage << ")";
    }
  }
}

void Waiter::throwTimeout(const std::function<bool(int)>& ready, const char* stage) const {
  std::ostringstream missing;
  int count = 0;
  for (int q = 0; q < numRanks_; ++q) {
    if (q == rank_ || ready(q)) continue;
    missing << (count++ ? ", " : "") << q;
  }
  std::ostringstream secs;
  secs << std::fixed << std::setprecision(1) << timeout_.count() / 1000.0;
  COHORT_THROW(TimeoutError) << "collective " << fingerprint_.str() << " timed out after " << secs.str()
                             << " s on rank " << rank_ << ": rank" << (count == 1 ? " " : "s ") << missing.str()
                             << " of " << numRanks_ << " did not " << stage;
}

}  // namespace cohort::collectives::shm
