#include "ipc/barrier.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
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

// Who gave up first and why: state 0 (nobody), 1 (being written), 2 (rank, code and message set).
struct alignas(64) ProcessBarrier::Failure {
  std::atomic<uint32_t> state;
  uint32_t rank;
  int32_t code;
  char message[500];
};
namespace {
constexpr uint32_t kWriting = 1;
constexpr uint32_t kWritten = 2;
constexpr size_t kFailureBytes = 512;
}  // namespace

struct alignas(64) ProcessBarrier::Slot {
  std::atomic<uint64_t> generation;
  std::atomic<uint64_t> pid;         // 0 until the rank registers
  std::atomic<uint64_t> startTicks;  // /proc/<pid>/stat field 22, 0 when unknown
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "barrier slots must be lock-free across processes");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "the failure record must be lock-free across processes");
size_t ProcessBarrier::bytesFor(int numRanks) {
  static_assert(sizeof(Slot) == kAlignment && sizeof(Control) <= kAlignment && sizeof(Failure) == kFailureBytes);
  COHORT_CHECK(numRanks >= 1 && numRanks <= kMaxRanks) << "numRanks " << numRanks;
  return kAlignment + kFailureBytes + static_cast<size_t>(numRanks) * sizeof(Slot);
}

void ProcessBarrier::initialize(void* memory, size_t bytes, int numRanks) {
  COHORT_CHECK(reinterpret_cast<uintptr_t>(memory) % kAlignment == 0) << "barrier memory is not 64-byte aligned";
  COHORT_CHECK(bytes >= bytesFor(numRanks)) << bytes << " bytes for " << numRanks << " ranks";
  auto* control = new (memory) Control{};
  control->numRanks = static_cast<uint32_t>(numRanks);
  new (static_cast<char*>(memory) + kAlignment) Failure{};
  auto* slots = reinterpret_cast<Slot*>(static_cast<char*>(memory) + kAlignment + kFailureBytes);
  for (int r = 0; r < numRanks; ++r) new (&slots[r]) Slot{};
  // The magic goes last; the memory only becomes visible to other processes through a release
  // (e.g. ShmRegion::publish()), which orders these stores before it.
  control->magic = kBarrierMagic;
}

ProcessBarrier::ProcessBarrier(void* memory, size_t bytes)
    : control_(static_cast<Control*>(memory)),
      failure_(reinterpret_cast<Failure*>(static_cast<char*>(memory) + kAlignment)),
      slots_(reinterpret_cast<Slot*>(static_cast<char*>(memory) + kAlignment + kFailureBytes)) {
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

void ProcessBarrier::abandon(int rank, const Error& error) {
  checkRank(rank);
  uint32_t none = 0;
  if (!failure_->state.compare_exchange_strong(none, kWriting, std::memory_order_acq_rel)) return;
  failure_->rank = static_cast<uint32_t>(rank);
  failure_->code = static_cast<int32_t>(error.code());
  const size_t n = std::min(std::strlen(error.what()), sizeof(failure_->message) - 1);
  std::memcpy(failure_->message, error.what(), n);
  failure_->message[n] = '\0';
  failure_->state.store(kWritten, std::memory_order_release);
}

bool ProcessBarrier::abandonedByOther(int rank) const {
  return failure_->state.load(std::memory_order_acquire) == kWritten && failure_->rank != static_cast<uint32_t>(rank);
}

void ProcessBarrier::throwAbandoned(int rank, const WaitOptions& options) const {
  std::ostringstream os;
  os << "local rank " << failure_->rank << " failed while rank " << rank << " waited at barrier '" << options.what
     << "': " << failure_->message;
  if (failure_->code == static_cast<int32_t>(ExitCode::kTimeout)) throw TimeoutError(os.str());
  throw PeerError(os.str());
}

uint64_t ProcessBarrier::generationOf(int rank) const { return slot(rank).generation.load(std::memory_order_acquire); }

int ProcessBarrier::firstMissing(uint64_t generation) const {
  for (int r = 0; r < numRanks(); ++r) {
    if (slots_[r].generation.load(std::memory_order_acquire) < generation) return r;
  }
  return -1;
}

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
    if (options.testHook) options.testHook(WaitPoint::kProcessUnknown, r);
    if (!processIsAlive(static_cast<pid_t>(pid), s.startTicks.load(std::memory_order_relaxed))) {
      // Gone, but it may have arrived first: the last rank to arrive passes at once and may exit
      // (after its last barrier) since its slot was read above. Its arrival was stored before it
      // exited, so a slot still short now means it died without arriving.
      if (s.generation.load(std::memory_order_acquire) >= generation) continue;
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
    // Another rank's failure is read before the arrivals (and a process's death before its slot, in
    // checkPeersAlive), never after: the last rank to arrive passes at once and may give up in its
    // next step, which must not fail a barrier it completed. A rank gives up after its own wait
    // saw every arrival (acquire, then release of the failure), so a failure seen together with a
    // rank still missing was recorded before this barrier completed.
    const bool abandoned = abandonedByOther(rank);
    const int missingRank = firstMissing(generation);
    if (missingRank < 0) return;
    if (options.testHook) options.testHook(WaitPoint::kRankMissing, missingRank);
    if (abandoned) throwAbandoned(rank, options);
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
