#include "ipc/barrier.h"

#include <unistd.h>

#include <atomic>
#include <iomanip>
#include <sstream>

#include "ipc/backoff.h"
#include "ipc/process_liveness.h"
#include "runtime/error.h"

namespace cohort::ipc {

namespace {
constexpr uint64_t kBarrierMagic = 0x5252414248434fcbull;
constexpr auto kLivenessInterval = std::chrono::milliseconds(20);
constexpr int kMaxListedRanks = 16;
}  // namespace

struct ProcessBarrier::Control {
  uint64_t magic;
  uint32_t numRanks;
};

struct alignas(64) ProcessBarrier::Slot {
  std::atomic<uint64_t> generation;
  std::atomic<uint64_t> pid;         // 0 until the rank registers
  std::atomic<uint64_t> startTicks;  // /proc/<pid>/stat field 22, 0 when unknown
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "barrier slots must be lock-free across processes");
size_t ProcessBarrier::bytesFor(int numRanks) {
  static_assert(sizeof(Slot) == kAlignment && sizeof(Control) <= kAlignment);
  COHORT_CHECK(numRanks >= 1 && numRanks <= kMaxRanks) << "numRanks " << numRanks;
  return kAlignment + static_cast<size_t>(numRanks) * sizeof(Slot);
}

void ProcessBarrier::initialize(void* memory, size_t bytes, int numRanks) {
  COHORT_CHECK(reinterpret_cast<uintptr_t>(memory) % kAlignment == 0) << "barrier memory is not 64-byte aligned";
  COHORT_CHECK(bytes >= bytesFor(numRanks)) << bytes << " bytes for " << numRanks << " ranks";
  auto* control = new (memory) Control{};
  control->numRanks = static_cast<uint32_t>(numRanks);
  auto* slots = reinterpret_cast<Slot*>(static_cast<char*>(memory) + kAlignment);
  for (int r = 0; r < numRanks; ++r) new (&slots[r]) Slot{};
  // The magic goes last; the memory only becomes visible to other processes through a release
  // (e.g. ShmRegion::publish()), which orders these stores before it.
  control->magic = kBarrierMagic;
}

ProcessBarrier::ProcessBarrier(void* memory, size_t bytes)
    : control_(static_cast<Control*>(memory)),
      slots_(reinterpret_cast<Slot*>(static_cast<char*>(memory) + kAlignment)) {
  COHORT_CHECK(reinterpret_cast<uintptr_t>(memory) % kAlignment == 0) << "barrier memory is not 64-byte aligned";
  if (bytes < kAlignment || control_->magic != kBarrierMagic || control_->numRanks < 1 ||
      control_->numRanks > static_cast<uint32_t>(kMaxRanks) || bytes < bytesFor(control_->numRanks)) {
    COHORT_THROW(IoError) << "shared memory at " << memory << " (" << bytes
                          << " bytes) does not hold an initialised process barrier";
  }
}

int ProcessBarrier::numRanks() const { return static_cast<int>(control_->numRanks); }

void ProcessBarrier::checkRank(int rank) const {
  COHORT_CHECK(rank >= 0 && rank < numRanks()) << "rank " << rank << " of " << numRanks();
}

ProcessBarrier::Slot& ProcessBarrier::slot(int rank) const {
  checkRank(rank);
  return slots_[rank];
}

void ProcessBarrier::registerRank(int rank) {
  Slot& s = slot(rank);
  const auto self = static_cast<uint64_t>(getpid());
  uint64_t previous = s.pid.load(std::memory_order_acquire);
  if (previous == self) return;
  if (previous != 0 && processIsAlive(static_cast<pid_t>(previous), s.startTicks.load(std::memory_order_relaxed))) {
    COHORT_THROW(InvalidArgument) << "rank " << rank << " is already registered at this barrier by live process "
                                  << previous << " (this is process " << self << "): two processes claim one rank";
  }
  // Start time before pid: a peer that reads the pid with acquire order also sees its start time.
  s.startTicks.store(processStartTicks(getpid()).value_or(0), std::memory_order_relaxed);
  s.pid.store(self, std::memory_order_release);
}

uint64_t ProcessBarrier::arrive(int rank) {
  registerRank(rank);
  Slot& s = slot(rank);
  uint64_t next = s.generation.load(std::memory_order_relaxed) + 1;
  s.generation.store(next, std::memory_order_release);
  return next;
}

uint64_t ProcessBarrier::generationOf(int rank) const { return slot(rank).generation.load(std::memory_order_acquire); }

int ProcessBarrier::missingRanks(uint64_t generation, std::string& missing) const {
  int count = 0;
  std::ostringstream os;
  for (int r = 0; r < numRanks(); ++r) {
    if (slots_[r].generation.load(std::memory_order_acquire) >= generation) continue;
    if (count < kMaxListedRanks) os << (count ? ", " : "") << r;
    ++count;
  }
  if (count > kMaxListedRanks) os << ", ...";
  missing = os.str();
  return count;
}

void ProcessBarrier::checkPeersAlive(int rank, uint64_t generation, const WaitOptions& options) const {
  for (int r = 0; r < numRanks(); ++r) {
    const Slot& s = slots_[r];
    if (r == rank || s.generation.load(std::memory_order_acquire) >= generation) continue;
    uint64_t pid = s.pid.load(std::memory_order_acquire);
    if (pid == 0) continue;  // not registered yet: only the deadline can tell
    if (!processIsAlive(static_cast<pid_t>(pid), s.startTicks.load(std::memory_order_relaxed))) {
      COHORT_THROW(PeerError) << "rank " << r << " (pid " << pid << ") exited while rank " << rank
                              << " waited at barrier '" << options.what << "'";
    }
  }
}

void ProcessBarrier::wait(int rank, uint64_t generation, const WaitOptions& options) const {
  checkRank(rank);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + options.timeout;
  auto nextLivenessCheck = start + kLivenessInterval;
  Backoff backoff;
  std::string missing;
  while (true) {
    bool all = true;
    for (int r = 0; r < numRanks() && all; ++r) {
      all = slots_[r].generation.load(std::memory_order_acquire) >= generation;
    }
    if (all) return;
    auto now = std::chrono::steady_clock::now();
    if (now >= nextLivenessCheck) {
      checkPeersAlive(rank, generation, options);
      nextLivenessCheck = now + kLivenessInterval;
    }
    if (now >= deadline) {
      int count = missingRanks(generation, missing);
      if (count == 0) return;  // they arrived while we looked at the clock
      std::ostringstream secs;
      secs << std::fixed << std::setprecision(1) << options.timeout.count() / 1000.0;
      COHORT_THROW(TimeoutError) << "barrier '" << options.what << "' timed out after " << secs.str() << " s: rank"
                                 << (count == 1 ? " " : "s ") << missing << " of " << numRanks()
                                 << " did not arrive (rank " << rank << " waited)";
    }
    backoff.pause();
  }
}

}  // namespace cohort::ipc
