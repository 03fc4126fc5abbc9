// One rank's communicator of cudasim's NCCL: the shared-memory segment its ranks meet in, and the
// steps its collectives run as: private to cudasim (nccl.cc makes communicators and issues to them).
//
// The segment. The first rank to join creates the segment (O_EXCL) sized for nranks, the others open
// it (a size for another nranks is ncclInvalidUsage). It holds a header page (the count of ranks
// that joined, then one RankControl per rank) and one slot of kSlotBytes per rank. A rank joins by
// claiming its RankControl (a second claim of a rank is ncclInvalidUsage) and filling in its pid,
// start time and GPU. The rank whose arrival completes the count unlinks the name, since every rank
// has the segment mapped by then; a communicator that goes before every rank joined unlinks it
// itself. So no name outlives its communicator.
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
//
// Thread safety: Comm's methods may be called from any thread (its mutex); join() runs once, on the
// initialising thread, and run() on the streams' threads.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "cudasim/nccl_operation.h"
#include "nccl.h"

namespace cudasim::nccl {

constexpr size_t kSlotBytes = size_t{1} << 20;
constexpr size_t kPageBytes = 4096;

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

inline size_t headerBytes(int nranks) {
  const size_t bytes = sizeof(SegmentHeader) + static_cast<size_t>(nranks) * sizeof(RankControl);
  return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes;
}

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

inline bool isFailure(ncclResult_t r) { return r != ncclSuccess && r != ncclInProgress; }

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

// From nccl.cc: the message ncclGetLastError returns for no communicator.
void setProcessLastError(const std::string& message);

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

}  // namespace cudasim::nccl
