// How one rank's communicator joins its segment and runs its collectives (nccl_comm.h).
#include "cudasim/nccl_comm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "cudasim/sim.h"

namespace cudasim::nccl {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kLivenessPeriod = std::chrono::milliseconds(20);
constexpr auto kMaxSleep = std::chrono::microseconds(1000);
constexpr int kSpins = 64;  // yields before a wait starts sleeping

size_t segmentBytes(int nranks) { return headerBytes(nranks) + static_cast<size_t>(nranks) * kSlotBytes; }

std::string systemError(const std::string& what) { return what + ": " + std::strerror(errno); }

// The start time (clock ticks after boot, /proc/<pid>/stat field 22) of a running process; nullopt
// when it is gone or a zombie.
std::optional<uint64_t> startTicksOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(paren + 1));
  char state = 0;
  fields >> state;
  if (state == 'Z' || state == 'X' || state == 'x') return std::nullopt;
  std::string skipped;
  for (int field = 4; field < 22; ++field) fields >> skipped;
  uint64_t ticks = 0;
  if (!(fields >> ticks)) return std::nullopt;
  return ticks;
}

// Whether the process that recorded `startTicks` at its join has exited (startTicks 0: its /proc
// could not be read then, so only whether the pid exists can be told).
bool hasExited(pid_t pid, uint64_t startTicks) {
  if (startTicks == 0) return ::kill(pid, 0) != 0 && errno == ESRCH;
  return startTicksOf(pid) != startTicks;
}

class Backoff {
 public:
  void pause() {
    if (spins_ < kSpins) {
      ++spins_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::duration_cast<std::chrono::microseconds>(kMaxSleep));
  }

 private:
  int spins_ = 0;
  std::chrono::microseconds sleep_{10};
};

}  // namespace

// Opens the segment, creating it when this rank is the first, and maps it once its creator has
// sized it.
Outcome Comm::attach() {
  const size_t bytes = segmentBytes(nranks_);
  int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0) {
    // Reserve the pages now: a full tmpfs fails here rather than with SIGBUS in a collective.
    if (::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(bytes)) != 0 && errno != EOPNOTSUPP &&
        errno != ENOSYS) {
      const std::string message = systemError("cannot reserve " + std::to_string(bytes) + " bytes for " + path_);
      ::close(fd);
      ::unlink(path_.c_str());
      return Outcome::error(ncclSystemError, message);
    }
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const std::string message = systemError("cannot size " + path_);
      ::close(fd);
      ::unlink(path_.c_str());
      return Outcome::error(ncclSystemError, message);
    }
  } else if (errno == EEXIST) {
    fd = ::open(path_.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);  // never through a symlink
  }
  if (fd < 0) return Outcome::error(ncclSystemError, systemError("cannot open " + path_));
  Backoff backoff;
  for (;;) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const std::string message = systemError("cannot stat " + path_);
      ::close(fd);
      return Outcome::error(ncclSystemError, message);
    }
    if (static_cast<size_t>(st.st_size) == bytes) break;
    if (st.st_size != 0) {
      ::close(fd);
      return Outcome::error(ncclInvalidUsage, path_ + " has " + std::to_string(st.st_size) + " bytes, but rank " +
                                                  std::to_string(rank_) + " of " + std::to_string(nranks_) +
                                                  " expects " + std::to_string(bytes) +
                                                  ": the ranks were given different nranks");
    }
    if (aborted_.load(std::memory_order_acquire)) {
      ::close(fd);
      return Outcome::abort();
    }
    backoff.pause();  // the creator is between open and ftruncate
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const std::string mapError = base == MAP_FAILED ? systemError("cannot map " + path_) : "";
  ::close(fd);
  if (base == MAP_FAILED) return Outcome::error(ncclSystemError, mapError);
  segment_.reset(static_cast<char*>(base), bytes, nranks_);
  return {};
}

Outcome Comm::join() {
  if (Outcome attached = attach(); !attached.ok()) return attached;
  RankControl& mine = segment_.control(rank_);
  uint32_t expected = kAbsent;
  if (!mine.state.compare_exchange_strong(expected, kClaimed, std::memory_order_acq_rel)) {
    return Outcome::error(ncclInvalidUsage, "rank " + std::to_string(rank_) + " joined twice (this is pid " +
                                                std::to_string(::getpid()) + "): two ranks were given the same rank");
  }
  claimed_ = true;
  mine.pid = static_cast<int32_t>(::getpid());
  mine.startTicks = startTicksOf(::getpid()).value_or(0);
  std::snprintf(mine.busId, sizeof mine.busId, "%s", busId_.c_str());
  mine.state.store(kJoined, std::memory_order_release);
  if (segment_.header().joined.fetch_add(1, std::memory_order_acq_rel) + 1 == nranks_) ::unlink(path_.c_str());
  Outcome all =
      waitForPeers([&](int p) { return segment_.control(p).state.load(std::memory_order_acquire) >= kJoined; }, "init");
  if (!all.ok()) return all;
  allJoined_ = true;
  return checkDistinctGpus();
}

// As NCCL: "Duplicate GPU detected", on every rank alike.
Outcome Comm::checkDistinctGpus() const {
  for (int a = 0; a < nranks_; ++a) {
    for (int b = a + 1; b < nranks_; ++b) {
      const char* busId = segment_.control(a).busId;
      if (std::strncmp(busId, segment_.control(b).busId, sizeof(RankControl::busId)) != 0) continue;
      return Outcome::error(ncclInvalidUsage, "Duplicate GPU detected: rank " + std::to_string(a) + " and rank " +
                                                  std::to_string(b) + " both on CUDA device " + busId);
    }
  }
  return {};
}

// The reason to stop waiting for `peer`, if there is one.
Outcome Comm::peerGone(int peer, bool checkLiveness, const std::string& what) const {
  const RankControl& c = segment_.control(peer);
  const std::string prefix = what + " on rank " + std::to_string(rank_) + ": rank " + std::to_string(peer);
  switch (c.state.load(std::memory_order_acquire)) {
    case kLeft:
      return Outcome::error(ncclRemoteError, prefix + " destroyed its communicator before taking part");
    case kAborted:
      return Outcome::error(ncclRemoteError, prefix + " aborted its communicator");
    case kJoined:
      if (checkLiveness && hasExited(c.pid, c.startTicks)) {
        return Outcome::error(ncclRemoteError, prefix + " (pid " + std::to_string(c.pid) + ") exited");
      }
      return {};
    default:
      return {};  // not there yet: nothing to watch
  }
}

template <class Ready>
Outcome Comm::waitForPeers(Ready ready, const std::string& what) {
  Backoff backoff;
  Clock::time_point nextLivenessCheck = Clock::now();
  for (;;) {
    if (aborted_.load(std::memory_order_acquire)) return Outcome::abort();
    const bool checkLiveness = Clock::now() >= nextLivenessCheck;
    bool all = true;
    for (int p = 0; p < nranks_; ++p) {
      if (ready(p)) continue;
      all = false;
      if (p == rank_) continue;  // an earlier operation of this rank, on another stream
      if (Outcome gone = peerGone(p, checkLiveness, what); !gone.ok()) return gone;
    }
    if (all) return {};
    if (checkLiveness) nextLivenessCheck = Clock::now() + kLivenessPeriod;
    backoff.pause();
  }
}

template <class Consume>
Outcome Comm::step(uint64_t s, const char* mine, size_t bytes, const std::string& what, Consume consume) {
  RankControl& own = segment_.control(rank_);
  Outcome free =
      waitForPeers([&](int p) { return segment_.control(p).read.load(std::memory_order_acquire) + 1 >= s; }, what);
  if (!free.ok()) return free;
  if (bytes > 0) std::memcpy(segment_.slot(rank_), mine, bytes);
  own.posted.store(s, std::memory_order_release);
  Outcome posted =
      waitForPeers([&](int p) { return segment_.control(p).posted.load(std::memory_order_acquire) >= s; }, what);
  if (!posted.ok()) return posted;
  std::vector<const char*> slots(static_cast<size_t>(nranks_));
  for (int p = 0; p < nranks_; ++p) slots[static_cast<size_t>(p)] = segment_.slot(p);
  consume(slots);
  own.read.store(s, std::memory_order_release);
  return {};
}

Outcome Comm::perform(const Operation& op) {
  const size_t es = op.elementBytes;
  const size_t perStep = kSlotBytes / es;
  const size_t total = op.postedElements(nranks_);
  const auto* send = static_cast<const char*>(op.send);
  auto* recv = static_cast<char*>(op.recv);
  const std::string what = op.describe();
  const bool posts = op.kind != Kind::kBroadcast || rank_ == op.root;
  for (uint64_t k = 0; k < op.steps; ++k) {
    const size_t first = k * perStep;
    const size_t n = std::min(perStep, total - first);
    auto consume = [&](std::vector<const char*>& slots) {
      switch (op.kind) {
        case Kind::kAllReduce:
          reduce(op.type, op.op, slots, recv + first * es, n);
          break;
        case Kind::kReduceScatter: {
          // This rank's block of the reduced input is [rank * count, (rank + 1) * count).
          const size_t lo = std::max(first, static_cast<size_t>(rank_) * op.count);
          const size_t hi = std::min(first + n, static_cast<size_t>(rank_ + 1) * op.count);
          if (lo >= hi) break;
          for (const char*& slot : slots) slot += (lo - first) * es;
          reduce(op.type, op.op, slots, recv + (lo - static_cast<size_t>(rank_) * op.count) * es, hi - lo);
          break;
        }
        case Kind::kAllGather:
          for (int p = 0; p < nranks_; ++p) {
            std::memcpy(recv + (static_cast<size_t>(p) * op.count + first) * es, slots[static_cast<size_t>(p)], n * es);
          }
          break;
        case Kind::kBroadcast:
          std::memcpy(recv + first * es, slots[static_cast<size_t>(op.root)], n * es);
          break;
      }
    };
    Outcome o = step(op.firstStep + k, posts ? send + first * es : nullptr, posts ? n * es : 0, what, consume);
    if (!o.ok()) return o;
  }
  return {};
}

void Comm::run(const Operation& op) {
  {
    std::lock_guard lock(m_);
    if (aborted_.load(std::memory_order_acquire) || isFailure(state_)) {
      ++finished_;
      cv_.notify_all();
      return;
    }
    ++running_;
  }
  const Outcome outcome = perform(op);
  {
    std::lock_guard lock(m_);
    --running_;
    ++finished_;
    if (!outcome.ok() && !outcome.aborted) recordLocked(outcome);
  }
  cv_.notify_all();
}

void Comm::recordLocked(const Outcome& outcome) {
  if (isFailure(state_)) return;  // the first failure is the one to report
  state_ = outcome.result;
  lastError_ = "cudasim NCCL: " + outcome.message;
  setProcessLastError(lastError_);
}

ncclResult_t Comm::issue(Operation op, cudaStream_t stream) {
  std::lock_guard lock(m_);
  if (isFailure(state_)) return state_;
  if (state_ == ncclInProgress || finalizing_) {
    setProcessLastError(std::string("cudasim NCCL: ") + nameOf(op.kind) + " on rank " + std::to_string(rank_) +
                        (finalizing_ ? " after ncclCommFinalize" : " before the communicator finished joining"));
    return ncclInvalidUsage;
  }
  op.sequence = issued_;
  op.firstStep = nextStep_;
  // Enqueued under the lock, so that operations get their steps in the order of their streams' queues.
  const cudaError_t e = cudasim::enqueue(stream, [self = shared_from_this(), op] { self->run(op); });
  if (e != cudaSuccess) {
    setProcessLastError(std::string("cudasim NCCL: ") + nameOf(op.kind) +
                        ": cannot enqueue on stream: " + cudaGetErrorString(e));
    return ncclUnhandledCudaError;
  }
  ++issued_;
  nextStep_ += op.steps;
  return ncclSuccess;
}

ncclResult_t Comm::finalize(bool wait) {
  std::unique_lock lock(m_);
  if (!initDone_) return ncclInvalidUsage;
  finalizing_ = true;
  if (wait) cv_.wait(lock, [&] { return finished_ == issued_ || isFailure(state_); });
  if (isFailure(state_)) return state_;
  return finished_ == issued_ ? ncclSuccess : ncclInProgress;
}

}  // namespace cudasim::nccl
