// NCCL as cudasim emulates it (include/nccl.h): communicators whose ranks are processes meeting in a
// shared-memory segment, and collectives that run as operations of the emulated streams.
//
// The segment. ncclGetUniqueId only names it: <dir>/cudasim-nccl-<pid>-<random>, dir being
// $COHORT_CUDASIM_NCCL_DIR, else $COHORT_SHM_DIR or /dev/shm as for Cohort's own segments. The id holds the name and a hash of dir
// (a test's dir may not fit in 128 bytes): each rank takes dir from its own environment, and one that
// sees another dir is refused (ncclInvalidUsage) rather than left waiting. The first rank to join
// creates the segment (O_EXCL) sized for nranks, the others open it (a size for another nranks is
// ncclInvalidUsage). It holds a header page (the count of ranks that joined, then one RankControl
// per rank) and one slot of kSlotBytes per rank. A rank joins by claiming its RankControl (a second
// claim of a rank is ncclInvalidUsage) and filling in its pid, start time and GPU. The rank whose
// arrival completes the count unlinks the name, since every rank has the segment mapped by then; a
// communicator that goes before every rank joined unlinks it itself. So no name outlives its
// communicator.
//
// A collective is a run of steps, numbered per communicator in issue order: every rank numbers them
// alike, since it issues the same collectives with the same counts. In step s each rank
//   1. waits until every rank has read step s - 1 (RankControl::read), so its own slot is free;
//   2. copies its piece of the input (at most kSlotBytes) into its slot and sets posted = s;
//   3. waits until every rank has posted step s;
//   4. computes its piece of the output from the slots, then sets read = s.
// A reduction folds the slots in rank order, so every rank gets the same bits; the input is in the
// slot before the output is written, so in-place collectives work.
//
// Waiting. A wait yields, then sleeps with backoff (at most kMaxSleep), and gives up when the
// communicator is aborted, or when a rank it waits for has aborted, has destroyed its communicator,
// or has exited (its /proc/<pid>/stat is gone, a zombie's, or another process's: checked every
// kLivenessPeriod). The last three are ncclRemoteError: ncclCommGetAsyncError reports it, later
// collectives return it, the failed operation leaves its output unspecified and the communicator's
// queued operations do nothing, so the stream drains. ncclCommAbort waits only for the operation
// running now, which sees the abort within one pause.
#include "nccl.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "cudasim/sim.h"

namespace cudasim::nccl {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kSlotBytes = size_t{1} << 20;
constexpr size_t kPageBytes = 4096;
constexpr auto kLivenessPeriod = std::chrono::milliseconds(20);
constexpr auto kMaxSleep = std::chrono::microseconds(1000);
constexpr int kSpins = 64;  // yields before a wait starts sleeping
constexpr char kIdMagic[8] = {'c', 'u', 'd', 'a', 's', 'i', 'm', 'N'};
constexpr size_t kNameBytes = NCCL_UNIQUE_ID_BYTES - sizeof kIdMagic - sizeof(uint64_t);  // with its NUL
constexpr unsigned kConfigMagic = 0xcafebeef;

// A rank's RankControl::state: kAbsent until it claims it, kJoined once its fields are filled in,
// then kLeft (ncclCommDestroy) or kAborted (ncclCommAbort, or a failed blocking init).
enum RankState : uint32_t { kAbsent = 0, kClaimed = 1, kJoined = 2, kLeft = 3, kAborted = 4 };

// Zero bytes (a fresh segment) are a valid state of every field.
struct alignas(64) RankControl {
  std::atomic<uint32_t> state;
  int32_t pid;
  uint64_t startTicks;  // the process's start time, against pid reuse
  char busId[32];
  alignas(64) std::atomic<uint64_t> posted;  // the last step whose piece is in the rank's slot
  alignas(64) std::atomic<uint64_t> read;    // the last step the rank has read every slot of
};

struct alignas(64) SegmentHeader {
  std::atomic<int32_t> joined;  // ranks that have filled in their RankControl
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "the counters are shared between processes");

size_t headerBytes(int nranks) {
  const size_t bytes = sizeof(SegmentHeader) + static_cast<size_t>(nranks) * sizeof(RankControl);
  return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}

size_t segmentBytes(int nranks) { return headerBytes(nranks) + static_cast<size_t>(nranks) * kSlotBytes; }

// What an emulated step or join ended with. `aborted`: this communicator was aborted meanwhile,
// which nobody is told about (the communicator is gone).
struct Outcome {
  ncclResult_t result = ncclSuccess;
  std::string message;
  bool aborted = false;

  bool ok() const { return result == ncclSuccess && !aborted; }
  static Outcome error(ncclResult_t result, std::string message) { return {result, std::move(message), false}; }
  static Outcome abort() { return {ncclSuccess, "", true}; }
};

bool isFailure(ncclResult_t r) { return r != ncclSuccess && r != ncclInProgress; }

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

// The segment's mapping; unmapped with the last operation that uses it.
class Mapping {
 public:
  Mapping() = default;
  ~Mapping() {
    if (base_) munmap(base_, bytes_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  void reset(char* base, size_t bytes, int nranks) {
    base_ = base;
    bytes_ = bytes;
    nranks_ = nranks;
  }
  SegmentHeader& header() const { return *reinterpret_cast<SegmentHeader*>(base_); }
  RankControl& control(int rank) const { return reinterpret_cast<RankControl*>(base_ + sizeof(SegmentHeader))[rank]; }
  char* slot(int rank) const { return base_ + headerBytes(nranks_) + static_cast<size_t>(rank) * kSlotBytes; }

 private:
  char* base_ = nullptr;
  size_t bytes_ = 0;
  int nranks_ = 0;
};

enum class Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast };

const char* nameOf(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce:
      return "ncclAllReduce";
    case Kind::kReduceScatter:
      return "ncclReduceScatter";
    case Kind::kAllGather:
      return "ncclAllGather";
    case Kind::kBroadcast:
      return "ncclBroadcast";
  }
  return "?";
}

// One collective as issued. count is the call's: per rank for reduce-scatter and all-gather.
struct Operation {
  Kind kind = Kind::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t type = ncclFloat;
  ncclRedOp_t op = ncclSum;
  int root = 0;
  size_t elementBytes = 0;
  // Set at issue.
  uint64_t sequence = 0;   // the communicator's how-many-th collective
  uint64_t firstStep = 0;  // steps [firstStep, firstStep + steps)
  uint64_t steps = 0;

  // Elements every rank posts over all steps (the root alone has any in a broadcast).
  size_t postedElements(int nranks) const {
    return kind == Kind::kReduceScatter ? count * static_cast<size_t>(nranks) : count;
  }
  size_t sendBytes(int rank, int nranks) const {
    if (kind == Kind::kBroadcast && rank != root) return 0;
    return postedElements(nranks) * elementBytes;
  }
  size_t recvBytes(int nranks) const {
    return (kind == Kind::kAllGather ? count * static_cast<size_t>(nranks) : count) * elementBytes;
  }
  std::string describe() const { return std::string(nameOf(kind)) + " #" + std::to_string(sequence); }
};

size_t elementBytesOf(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

// Calls f(T{}) with the C++ type of a type reductions take; false for the others.
template <class F>
bool withArithmeticType(ncclDataType_t type, F&& f) {
  switch (type) {
    case ncclInt8:
      return f(int8_t{}), true;
    case ncclUint8:
      return f(uint8_t{}), true;
    case ncclInt32:
      return f(int32_t{}), true;
    case ncclUint32:
      return f(uint32_t{}), true;
    case ncclInt64:
      return f(int64_t{}), true;
    case ncclUint64:
      return f(uint64_t{}), true;
    case ncclFloat32:
      return f(float{}), true;
    case ncclFloat64:
      return f(double{}), true;
    default:
      return false;
  }
}

// A rounded floating-point value the compiler may not fuse into a multiply-add (as __fmul_rn).
template <class T>
T rounded(T v) {
  if constexpr (std::is_floating_point_v<T>) asm("" : "+x"(v));
  return v;
}

// a op b: integers wrap, as on the GPU (and without the undefined behaviour of signed overflow);
// floats are rounded.
template <class T, class Op>
T apply(T a, T b, Op op) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(op(static_cast<U>(a), static_cast<U>(b))));
  } else {
    return rounded<T>(op(a, b));
  }
}

template <class T>
T plus(T a, T b) {
  return apply(a, b, std::plus<>());
}

template <class T>
T times(T a, T b) {
  return apply(a, b, std::multiplies<>());
}

// out[i] = post(pre(in[0][i]) ∘ pre(in[1][i]) ∘ ...), folded in rank order.
template <class T, class Pre, class Combine, class Post>
void fold(const std::vector<const char*>& in, char* out, size_t n, Pre pre, Combine combine, Post post) {
  T* o = reinterpret_cast<T*>(out);
  for (size_t i = 0; i < n; ++i) {
    T acc = pre(reinterpret_cast<const T*>(in[0])[i]);
    for (size_t r = 1; r < in.size(); ++r) acc = combine(acc, pre(reinterpret_cast<const T*>(in[r])[i]));
    o[i] = post(acc);
  }
}

// Max and min of floats as CUDA's fmaxf/fminf (a NaN loses to a number).
template <class T>
void reduceAs(ncclRedOp_t op, const std::vector<const char*>& in, char* out, size_t n) {
  const auto same = [](T x) { return x; };
  const auto larger = [](T a, T b) -> T {
    if constexpr (std::is_floating_point_v<T>) return std::fmax(a, b);
    return std::max(a, b);
  };
  const auto smaller = [](T a, T b) -> T {
    if constexpr (std::is_floating_point_v<T>) return std::fmin(a, b);
    return std::min(a, b);
  };
  const int nranks = static_cast<int>(in.size());
  switch (op) {
    case ncclSum:
      return fold<T>(in, out, n, same, plus<T>, same);
    case ncclProd:
      return fold<T>(in, out, n, same, times<T>, same);
    case ncclMax:
      return fold<T>(in, out, n, same, larger, same);
    case ncclMin:
      return fold<T>(in, out, n, same, smaller, same);
    case ncclAvg:
      if constexpr (std::is_floating_point_v<T>) {
        const T scale = static_cast<T>(1.0 / nranks);  // NCCL's premultiplied sum
        return fold<T>(
            in, out, n, [scale](T x) { return rounded<T>(x * scale); }, plus<T>, same);
      } else {
        return fold<T>(in, out, n, same, plus<T>, [nranks](T x) { return static_cast<T>(x / static_cast<T>(nranks)); });
      }
    default:
      return;  // refused at issue
  }
}

void reduce(ncclDataType_t type, ncclRedOp_t op, const std::vector<const char*>& in, char* out, size_t n) {
  withArithmeticType(type, [&](auto zero) { reduceAs<decltype(zero)>(op, in, out, n); });
}

// One rank's communicator, shared by its handle and its queued operations (the segment stays mapped
// until the last of them is gone).
class Comm : public std::enable_shared_from_this<Comm> {
 public:
  Comm(int rank, int nranks, std::string path, std::string busId)
      : rank_(rank), nranks_(nranks), path_(std::move(path)), busId_(std::move(busId)) {}

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const std::string& path() const { return path_; }
  // ncclCommSplit's count on this communicator: every rank splits in the same order, so the k-th
  // split's groups get the same names on every rank.
  uint64_t nextSplit() { return splits_++; }

  // Creates or opens the segment, claims this rank's place, waits for every rank (file comment).
  Outcome join();
  // Ends ncclInProgress with join()'s outcome.
  void finishInit(const Outcome& outcome) {
    std::lock_guard lock(m_);
    initDone_ = true;
    if (outcome.ok())
      state_ = ncclSuccess;
    else if (!outcome.aborted)
      recordLocked(outcome);
  }
  bool initDone() {
    std::lock_guard lock(m_);
    return initDone_;
  }

  // The issuing thread: assigns the operation its steps and enqueues it on `stream`.
  ncclResult_t issue(Operation op, cudaStream_t stream);
  ncclResult_t asyncError() {
    std::lock_guard lock(m_);
    if (state_ != ncclSuccess) return state_;
    return finalizing_ && finished_ < issued_ ? ncclInProgress : ncclSuccess;
  }
  ncclResult_t finalize(bool wait);
  // Waits until every issued operation has run (or been skipped after a failure).
  void waitIdle() {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return finished_ == issued_; });
  }
  // Makes every wait give up; join() and run() notice within one pause.
  void requestAbort() { aborted_.store(true, std::memory_order_release); }
  // After requestAbort and the end of join(): waits for the operation running now.
  void stopRunning() {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return running_ == 0; });
  }
  // After join() ended: tells the other ranks this one is gone (kLeft or kAborted), and removes the
  // name if not every rank joined.
  void leave(RankState how) {
    if (claimed_) segment_.control(rank_).state.store(how, std::memory_order_release);
    if (!allJoined_) ::unlink(path_.c_str());
  }
  std::string lastError() {
    std::lock_guard lock(m_);
    return lastError_;
  }

 private:
  Outcome attach();
  void run(const Operation& op);
  Outcome perform(const Operation& op);
  template <class Consume>
  Outcome step(uint64_t s, const char* mine, size_t bytes, const std::string& what, Consume consume);
  template <class Ready>
  Outcome waitForPeers(Ready ready, const std::string& what);
  Outcome peerGone(int peer, bool checkLiveness, const std::string& what) const;
  Outcome checkDistinctGpus() const;
  void recordLocked(const Outcome& outcome);

  const int rank_;
  const int nranks_;
  const std::string path_;
  const std::string busId_;
  Mapping segment_;
  bool claimed_ = false;    // this rank's RankControl is ours (written by join())
  bool allJoined_ = false;  // every rank joined, so the name is gone (written by join())
  std::atomic<bool> aborted_{false};

  std::mutex m_;
  std::condition_variable cv_;
  ncclResult_t state_ = ncclInProgress;  // the init's, then the first failure
  std::string lastError_;
  bool initDone_ = false;
  bool finalizing_ = false;
  uint64_t issued_ = 0, finished_ = 0, nextStep_ = 1;
  int running_ = 0;
  uint64_t splits_ = 0;  // the issuing thread's
};

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

void setProcessLastError(const std::string& message);

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

// Live handles, so that a destroyed or made-up communicator is ncclInvalidArgument, not a crash;
// and the process's last error message.
struct Registry {
  std::mutex m;
  std::set<ncclComm_t> live;
  std::string lastError;
};

Registry* gRegistry = nullptr;

// A forked child has none of its parent's communicators (their threads are not there), and another
// thread may have held the lock at the fork.
void resetAfterFork() { gRegistry = new Registry; }

Registry& registry() {
  static const bool once = [] {
    gRegistry = new Registry;  // never destroyed: stream threads may outlive static destruction
    pthread_atfork(nullptr, nullptr, resetAfterFork);
    return true;
  }();
  (void)once;
  return *gRegistry;
}

void setProcessLastError(const std::string& message) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  r.lastError = message;
}

ncclResult_t refuse(ncclResult_t result, const std::string& message) {
  setProcessLastError("cudasim NCCL: " + message);
  return result;
}

// The directory of the segments: $COHORT_CUDASIM_NCCL_DIR, else $COHORT_SHM_DIR, else /dev/shm. Real
// NCCL reaches another node over the network, whatever that node's /dev/shm: a test that plays
// several nodes on one machine gives each its own COHORT_SHM_DIR and every rank this one directory.
std::string shmDirectory() {
  for (const char* name : {"COHORT_CUDASIM_NCCL_DIR", "COHORT_SHM_DIR"}) {
    const char* dir = std::getenv(name);
    if (dir && *dir) return dir;
  }
  return "/dev/shm";
}

uint64_t hashOf(const std::string& text) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The id's layout: kIdMagic, the hash of the directory, the segment's name.
struct IdLayout {
  char magic[sizeof kIdMagic];
  uint64_t directoryHash;
  char name[kNameBytes];
};
static_assert(sizeof(IdLayout) == NCCL_UNIQUE_ID_BYTES);

// The segment's path a unique id names here, or an error: not one of ours, or another directory.
Outcome pathOf(const ncclUniqueId& id, std::string& path) {
  IdLayout layout;
  std::memcpy(&layout, id.internal, sizeof layout);
  const size_t length = strnlen(layout.name, kNameBytes);
  if (std::memcmp(layout.magic, kIdMagic, sizeof kIdMagic) != 0 || length == 0 || length == kNameBytes) {
    return Outcome::error(ncclInvalidArgument, "ncclCommInitRankConfig: not a unique id from ncclGetUniqueId");
  }
  const std::string dir = shmDirectory();
  if (hashOf(dir) != layout.directoryHash) {
    return Outcome::error(ncclInvalidUsage,
                          "ncclCommInitRankConfig: the unique id was made with another "
                          "COHORT_CUDASIM_NCCL_DIR or COHORT_SHM_DIR than this rank's (" +
                              dir + ")");
  }
  path = dir + "/" + std::string(layout.name, length);
  return {};
}

}  // namespace
}  // namespace cudasim::nccl

// The handle: the state, and the thread of a non-blocking init.
struct ncclComm {
  std::shared_ptr<cudasim::nccl::Comm> state;
  bool blocking = true;
  std::thread joiner;
};

namespace cudasim::nccl {
namespace {

std::shared_ptr<Comm> find(ncclComm_t comm) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  return r.live.count(comm) ? comm->state : nullptr;
}

// Removes the handle from the live ones; nullptr when it is not one.
std::unique_ptr<ncclComm> take(ncclComm_t comm) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  return r.live.erase(comm) ? std::unique_ptr<ncclComm>(comm) : nullptr;
}

ncclComm_t publish(std::unique_ptr<ncclComm> handle) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  r.live.insert(handle.get());
  return handle.release();
}

void abortHandle(std::unique_ptr<ncclComm> handle) {
  handle->state->requestAbort();
  if (handle->joiner.joinable()) handle->joiner.join();
  handle->state->leave(kAborted);
  handle->state->stopRunning();
}

// Checks a collective's arguments as NCCL does, and beyond it that its buffers are device memory;
// then issues it.
ncclResult_t submit(ncclComm_t comm, cudaStream_t stream, Operation op) {
  const std::string name = nameOf(op.kind);
  std::shared_ptr<Comm> state = find(comm);
  if (!state) return refuse(ncclInvalidArgument, name + ": not a live communicator");
  const int rank = state->rank(), nranks = state->nranks();
  op.elementBytes = elementBytesOf(op.type);
  if (op.elementBytes == 0) return refuse(ncclInvalidArgument, name + ": invalid datatype " + std::to_string(op.type));
  const bool reduces = op.kind == Kind::kAllReduce || op.kind == Kind::kReduceScatter;
  if (reduces && (op.op < ncclSum || op.op >= ncclNumOps)) {
    return refuse(ncclInvalidArgument, name + ": invalid reduction operation " + std::to_string(op.op));
  }
  if (reduces && !withArithmeticType(op.type, [](auto) {})) {
    return refuse(ncclInvalidArgument, name + ": reductions of datatype " + std::to_string(op.type) +
                                           " (16- and 8-bit floats) are not emulated");
  }
  if (op.kind == Kind::kBroadcast && (op.root < 0 || op.root >= nranks)) {
    return refuse(ncclInvalidArgument,
                  name + ": root " + std::to_string(op.root) + " is not a rank of " + std::to_string(nranks));
  }
  if (op.count == 0) return ncclSuccess;
  const std::pair<const void*, size_t> buffers[] = {{op.send, op.sendBytes(rank, nranks)},
                                                    {op.recv, op.recvBytes(nranks)}};
  for (const auto& [p, bytes] : buffers) {
    if (bytes == 0 || cudasim::isDeviceRange(p, bytes)) continue;
    std::ostringstream os;
    os << name << " on rank " << rank << ": " << (p == op.send ? "sendbuff " : "recvbuff ") << p << " (" << bytes
       << " bytes) does not lie inside one device allocation";
    return refuse(ncclInvalidArgument, os.str());
  }
  const size_t perStep = kSlotBytes / op.elementBytes;
  op.steps = (op.postedElements(nranks) + perStep - 1) / perStep;
  return state->issue(op, stream);
}

const char* threadCopy(std::string text) {
  thread_local std::string copy;
  copy = std::move(text);
  return copy.c_str();
}

}  // namespace
}  // namespace cudasim::nccl

using namespace cudasim::nccl;

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return refuse(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is null");
  std::random_device random;
  char name[kNameBytes];
  std::snprintf(name, sizeof name, "cudasim-nccl-%d-%08x%08x", static_cast<int>(::getpid()), random(), random());
  IdLayout layout{};
  std::memcpy(layout.magic, kIdMagic, sizeof kIdMagic);
  layout.directoryHash = hashOf(shmDirectory());
  std::memcpy(layout.name, name, sizeof name);
  std::memcpy(uniqueId->internal, &layout, sizeof layout);
  return ncclSuccess;
}

}  // extern "C"

namespace cudasim::nccl {
namespace {

// ncclCommInitRankConfig and ncclCommSplit: joins the communicator whose segment is `path`.
ncclResult_t initAt(ncclComm_t* comm, int nranks, const std::string& path, int rank, ncclConfig_t* config) {
  if (config && config->magic != kConfigMagic) {
    return refuse(ncclInvalidArgument, "ncclCommInitRankConfig: config was not set from NCCL_CONFIG_INITIALIZER");
  }
  const bool blocking = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
  int device = 0;
  char busId[32] = {};
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetPCIBusId(busId, sizeof busId, device) != cudaSuccess) {
    const cudaError_t e = cudaGetLastError();
    return refuse(ncclUnhandledCudaError,
                  std::string("ncclCommInitRankConfig: no current CUDA device: ") + cudaGetErrorString(e));
  }
  auto handle = std::make_unique<ncclComm>();
  handle->state = std::make_shared<Comm>(rank, nranks, path, busId);
  handle->blocking = blocking;
  if (blocking) {
    const Outcome joined = handle->state->join();
    handle->state->finishInit(joined);
    if (!joined.ok()) {
      handle->state->leave(kAborted);
      return refuse(joined.result, joined.message);
    }
    *comm = publish(std::move(handle));
    return ncclSuccess;
  }
  handle->joiner = std::thread([state = handle->state] { state->finishInit(state->join()); });
  *comm = publish(std::move(handle));
  return ncclInProgress;
}

// Every rank's (color, key), gathered over `parent` as one of its collectives, on a stream of its
// own that the host waits for (NCCL's split is a host call). The result's first error, if any.
ncclResult_t gatherColors(const std::shared_ptr<Comm>& parent, int color, int key, std::vector<int32_t>& all) {
  const int32_t mine[2] = {color, key};
  all.assign(2 * static_cast<size_t>(parent->nranks()), 0);
  Operation op{.kind = Kind::kAllGather, .send = mine, .recv = all.data(), .count = 2, .type = ncclInt32};
  op.elementBytes = sizeof(int32_t);
  op.steps = 1;
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    return refuse(ncclUnhandledCudaError, "ncclCommSplit: cannot create a stream");
  }
  ncclResult_t result = parent->issue(op, stream);
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  if (result == ncclSuccess) result = parent->asyncError();
  return result;
}

}  // namespace
}  // namespace cudasim::nccl

extern "C" {

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  if (!comm) return refuse(ncclInvalidArgument, "ncclCommInitRankConfig: comm is null");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return refuse(ncclInvalidArgument, "ncclCommInitRankConfig: rank " + std::to_string(rank) + " of " +
                                           std::to_string(nranks) + " is not a rank");
  }
  std::string path;
  if (const Outcome named = pathOf(commId, path); !named.ok()) return refuse(named.result, named.message);
  return initAt(comm, nranks, path, rank, config);
}

// The groups' segments are named after the parent's: <parent's path>-s<k>c<color>, k counting the
// parent's splits. The new communicator's rank is its place by (key, parent rank), as in NCCL.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (!newcomm) return refuse(ncclInvalidArgument, "ncclCommSplit: newcomm is null");
  *newcomm = nullptr;
  std::shared_ptr<Comm> parent = find(comm);
  if (!parent) return refuse(ncclInvalidArgument, "ncclCommSplit: not a live communicator");
  if (color < NCCL_SPLIT_NOCOLOR) {
    return refuse(ncclInvalidArgument, "ncclCommSplit: color " + std::to_string(color) + " is negative");
  }
  std::vector<int32_t> all;
  if (const ncclResult_t r = gatherColors(parent, color, key, all); r != ncclSuccess) return r;
  const uint64_t index = parent->nextSplit();
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  std::vector<int> members;
  for (int r = 0; r < parent->nranks(); ++r) {
    if (all[2 * static_cast<size_t>(r)] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[2 * static_cast<size_t>(a) + 1] < all[2 * static_cast<size_t>(b) + 1];
  });
  const int rank = static_cast<int>(std::find(members.begin(), members.end(), parent->rank()) - members.begin());
  const std::string path = parent->path() + "-s" + std::to_string(index) + "c" + std::to_string(color);
  if (!config) {  // NCCL: the parent's configuration; here, whether it blocks
    static ncclConfig_t nonBlocking = [] {
      ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
      c.blocking = 0;
      return c;
    }();
    if (!comm->blocking) config = &nonBlocking;
  }
  return initAt(newcomm, static_cast<int>(members.size()), path, rank, config);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!asyncError) return refuse(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is null");
  std::shared_ptr<Comm> state = find(comm);
  if (!state) return refuse(ncclInvalidArgument, "ncclCommGetAsyncError: not a live communicator");
  *asyncError = state->asyncError();
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  std::shared_ptr<Comm> state = find(comm);
  if (!state) return refuse(ncclInvalidArgument, "ncclCommFinalize: not a live communicator");
  const ncclResult_t result = state->finalize(comm->blocking);
  if (result == ncclInvalidUsage) return refuse(result, "ncclCommFinalize before the communicator finished joining");
  return result;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  std::unique_ptr<ncclComm> handle = take(comm);
  if (!handle) return refuse(ncclInvalidArgument, "ncclCommDestroy: not a live communicator");
  if (!handle->state->initDone()) {
    abortHandle(std::move(handle));
    return ncclSuccess;
  }
  if (handle->joiner.joinable()) handle->joiner.join();
  handle->state->waitIdle();
  handle->state->leave(kLeft);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  std::unique_ptr<ncclComm> handle = take(comm);
  if (!handle) return refuse(ncclInvalidArgument, "ncclCommAbort: not a live communicator");
  abortHandle(std::move(handle));
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  if (std::shared_ptr<Comm> state = find(comm)) {
    if (std::string own = state->lastError(); !own.empty()) return threadCopy(std::move(own));
  }
  Registry& r = registry();
  std::lock_guard lock(r.m);
  return threadCopy(r.lastError);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return submit(
      comm, stream,
      {.kind = Kind::kAllReduce, .send = sendbuff, .recv = recvbuff, .count = count, .type = datatype, .op = op});
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return submit(comm, stream,
                {.kind = Kind::kReduceScatter,
                 .send = sendbuff,
                 .recv = recvbuff,
                 .count = recvcount,
                 .type = datatype,
                 .op = op});
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return submit(comm, stream,
                {.kind = Kind::kAllGather, .send = sendbuff, .recv = recvbuff, .count = sendcount, .type = datatype});
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return submit(
      comm, stream,
      {.kind = Kind::kBroadcast, .send = sendbuff, .recv = recvbuff, .count = count, .type = datatype, .root = root});
}

}  // extern "C"
