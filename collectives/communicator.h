// Communicator: collective operations among the ranks of one job (docs/collectives.md; docs/architecture.md, "Layers").
//
// Every rank calls the same collectives in the same order (a rule shm and mpi check: see
// Fingerprint; nccl's watchdog times out what that leaves stuck). Each call starts the operation and
// returns a Work; the buffers must stay valid and untouched until wait() returns. Collectives run in
// the order they were issued, one after another, on the backend's own progress thread (shm), inside
// MPI (mpi) or on a CUDA stream (nccl), so a caller may issue several and wait for them later
// (GradSync overlaps backward this way).
// wait(timeout) throws:
//   TimeoutError  the ranks that did not arrive, the collective's sequence number and fingerprint;
//   PeerError     a rank died (names it);
//   InvalidArgument  ranks issued different collectives (names the ranks and both fingerprints:
//                 kind, op, element type, root, count), detected before any data is touched (shm, mpi).
// After an error the communicator is unusable (every later wait() rethrows it).
// Each collective takes its options struct (Gloo's style): the element type (fp32 or bf16; `count`
// is in elements of it), the reduction where there is one, the root of a broadcast. bf16
// reductions accumulate in fp32 and round to bf16 once, at the end, on every backend (nccl widens
// into fp32 on its stream and reduces in fp32). Buffers are CPU memory for shm, mpi and hierarchical,
// device memory on the rank's GPU (cuda:<local rank>) for nccl.
// In place: allReduce and broadcast with input == output; reduceScatter and allGather in NCCL's
// layout, where this rank's chunk lies at offset rank * countPerRank of the full buffer
// (reduceScatter: output == input + rank*countPerRank; allGather: input == output +
// rank*countPerRank). Any other overlap of input and output is an InvalidArgument.
// nccl: collectives run on the backend's communication stream. Given CommunicatorOptions::
// computeStream, each one starts after the work enqueued there so far, and Work::wait makes that
// stream wait for it instead of blocking the host (no host synchronisation; docs/collectives.md).
// Work::waitOn(stream) asks for that per call: on nccl the stream waits for the collective (an
// event, the host returns at once); on the CPU backends it is a host wait (the stream is not used).
// Ownership: the caller owns each Work through its WorkPtr; the built-in backends recycle Works
// (work_pool.h), so a collective in steady state allocates none. A Work may be destroyed after its
// communicator, but not waited for then (mpi excepted; shm and hierarchical check it).
// Thread safety: issue collectives from one thread; Work::wait may be called from that thread only.
//
//   auto comm = makeCommunicator({.backend = "shm", .world = world, .timeout = 30s});
//   auto work = comm->allReduce(grads, grads, n, {.op = ReduceOp::kAvg});
//   work->wait(30s);
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/world_info.h"

namespace cohort::runtime {
class Stream;  // runtime/stream.h; only the nccl backend uses it (this interface links no CUDA)
}  // namespace cohort::runtime

namespace cohort::collectives {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin };
enum class CollectiveKind : uint8_t { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };

const char* toString(ReduceOp op);
const char* toString(CollectiveKind kind);

// What every rank must agree on for one collective. Compared across ranks before any data moves.
struct Fingerprint {
  uint64_t sequence = 0;  // 0, 1, 2, ... per communicator
  CollectiveKind kind = CollectiveKind::kBarrier;
  ReduceOp op = ReduceOp::kSum;
  runtime::DType dtype = runtime::DType::kF32;
  int32_t root = -1;   // broadcast only
  uint64_t count = 0;  // elements (per rank for reduceScatter/allGather)
  bool operator==(const Fingerprint& o) const;
  // "#12 allreduce(sum, fp32, 1000 elements)"
  std::string str() const;
};

class Work {
 public:
  virtual ~Work() = default;
  virtual bool done() = 0;
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  // Orders `stream` after the collective. nccl: the stream waits for the collective's completion
  // event and the host returns at once (what wait() does given CommunicatorOptions::computeStream);
  // a collective staged through host memory waits on the host. The CPU backends: wait(timeout) on
  // the host (their collectives are done when it returns, so any later work is ordered after them).
  // `timeout` bounds a host wait; on the device the watchdog enforces the communicator's timeout.
  virtual void waitOn(const runtime::Stream& stream, std::chrono::milliseconds timeout) { wait(timeout); }

 protected:
  // Called once, by the WorkPtr that owns this Work, when it lets go. The built-in backends recycle
  // their Works here (work_pool.h), so that a collective allocates none; a Work of one's own is
  // simply deleted.
  virtual void dispose() { delete this; }
  friend struct WorkDeleter;
};

// WorkPtr's deleter: Work::dispose(). It converts from std::default_delete, so a Work made with
// std::make_unique (a test's or a user's own Communicator) still becomes a WorkPtr.
struct WorkDeleter {
  WorkDeleter() = default;
  template <typename T>
  WorkDeleter(const std::default_delete<T>&) noexcept {}  // implicit: unique_ptr converts only so
  void operator()(Work* work) const { work->dispose(); }
};
// Owns a collective's Work. Destroying it after its communicator is safe; calling wait() or done()
// then is not (except on mpi, whose Works keep the MPI state alive).
using WorkPtr = std::unique_ptr<Work, WorkDeleter>;

// Memory from Communicator::allocateBuffer(): zero-filled, 4 * count bytes (count float32 or up to
// 2 * count bf16 elements), 64-byte aligned. On the shm backend every local rank can map it, and an
// all-reduce, reduce-scatter or all-gather whose input and output lie in such buffers on every rank
// reads the peers' data where it is, without the staging copies (about twice the bandwidth for
// large messages; docs/collectives.md). On the nccl backend it is zeroed device memory
// on the rank's GPU (cudaMalloc, 256-byte aligned). Elsewhere it is ordinary memory. Any buffer
// works with any collective; freeing one that a pending collective uses is undefined.
// allocateBuffer is collective on the shm backend: every rank calls it with the same count, in the
// same order as its other collectives (a different count is an InvalidArgument on every rank).
class Buffer {
 public:
  virtual ~Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* data() const { return data_; }
  size_t count() const { return count_; }
  uint16_t* bf16() const { return reinterpret_cast<uint16_t*>(data_); }  // the same memory as bf16 bits

 protected:
  Buffer(float* data, size_t count) : data_(data), count_(count) {}

 private:
  float* data_;
  size_t count_;
};
using BufferPtr = std::unique_ptr<Buffer>;

// One options struct per collective (Gloo's style). Every rank passes the same values; a
// difference is a collective mismatch (Fingerprint).
struct AllReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  runtime::DType dtype = runtime::DType::kF32;
};
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
  runtime::DType dtype = runtime::DType::kF32;
};
struct AllGatherOptions {
  runtime::DType dtype = runtime::DType::kF32;
};
struct BroadcastOptions {
  int root = 0;
  runtime::DType dtype = runtime::DType::kF32;
};
// Communicator::split's (MPI_Comm_split's and ncclCommSplit's pair): the ranks that pass the same
// color form one group, ordered by key, ties by their rank in the parent.
struct SplitOptions {
  static constexpr int kNoGroup = -1;  // this rank joins no group: split() returns nullptr
  int color = 0;                       // >= 0, or kNoGroup
  int key = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  // output[i] = op over ranks of input[i], i < count.
  virtual WorkPtr allReduce(const void* input, void* output, size_t count, const AllReduceOptions& options) = 0;
  // input holds size()*countPerRank elements; rank r receives the reduction of chunk r.
  virtual WorkPtr reduceScatter(const void* input, void* output, size_t countPerRank,
                                const ReduceScatterOptions& options) = 0;
  // output holds size()*countPerRank elements: rank r's input at chunk r.
  virtual WorkPtr allGather(const void* input, void* output, size_t countPerRank, const AllGatherOptions& options) = 0;
  // data on options.root is copied to every rank's data.
  virtual WorkPtr broadcast(void* data, size_t count, const BroadcastOptions& options) = 0;
  // The fp32 shorthand: broadcast(data, count, {.root = root}).
  WorkPtr broadcast(float* data, size_t count, int root) {
    return broadcast(data, count, BroadcastOptions{.root = root});
  }
  virtual WorkPtr barrier() = 0;

  // Sub-groups (MPI_Comm_split, ncclCommSplit): a new communicator over the ranks of this one that
  // pass the same options.color, numbered by (key, rank here); nullptr for SplitOptions::kNoGroup.
  // Collective over this communicator: every rank calls it, in the same order as its collectives
  // (the collectives issued before it complete first). The groups are independent of each other and
  // of this communicator, which stays usable; each has the backend, timeout and element types of
  // this one (hierarchical: a group inside one node is shm, any other mpi). Waits are bounded by the
  // communicator's timeout. Throws InvalidArgument for a color below kNoGroup (naming the rank, on
  // every rank), and as the collectives do. The group may outlive this communicator. This default,
  // for communicators of one's own, throws InvalidArgument.
  virtual std::unique_ptr<Communicator> split(const SplitOptions& options);

  // A buffer of `count` floats for collectives (see Buffer); call from the issuing thread, on every
  // rank alike (collective). This default gives ordinary memory.
  virtual BufferPtr allocateBuffer(size_t count);
};

struct CommunicatorOptions {
  // "shm", "mpi", "hierarchical", "nccl"; empty = shm on one node, hierarchical across nodes (flat
  // mpi where the nodes run different numbers of workers; docs/collectives.md: the caller picks nccl for CUDA).
  std::string backend;
  runtime::WorldInfo world;
  // Set-up (rendezvous) waits and each collective (nccl: the watchdog aborts a collective that has
  // not finished this long after it was issued).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // nccl only: the stream the caller's kernels run on, on cuda:<world.localRank>; must outlive the
  // communicator. Each collective starts after the work enqueued on it so far, and Work::wait makes
  // it wait for the collective (no host synchronisation). nullptr: collectives start at once (their
  // input must already be on the device) and Work::wait blocks the host until they finish.
  const runtime::Stream* computeStream = nullptr;
  // For tests of the failure paths; the default injects nothing. mpi: the process of world rank
  // `rank` issues its collective #mismatchAt (on every mpi communicator it has, sub-groups
  // included) with one element fewer (one more when it has none), as a rank with a bug would, so a
  // test can check that every rank reports the mismatch before any data moves.
  struct FaultInjection {
    int rank = -1;
    int64_t mismatchAt = -1;
  };
  FaultInjection faultInjection{};  // {}: no -Wmissing-field-initializers where it is left out
};

// The backends compiled into this binary, e.g. {"shm", "mpi"} or {"shm", "mpi", "nccl"}.
std::vector<std::string> availableBackends();
// The backend makeCommunicator() would use: options.backend, or the default for this world.
// Throws InvalidArgument for an unknown backend or one this build lacks (the message lists what it
// has), or one that cannot serve this world (shm across nodes).
std::string resolveBackend(const CommunicatorOptions& options);
// Throws as resolveBackend(); TimeoutError when peers do not arrive at the rendezvous.
std::unique_ptr<Communicator> makeCommunicator(const CommunicatorOptions& options);

// This process is failing: an error is unwinding out of a collective caller (train::Job calls it for
// every error leaving step(), barrier() or reduce()). MPI is then not finalised at exit:
// MPI_Finalize is a fence over every process of the job, which waits forever for a peer that is
// gone or cut off; mpirun ends the job on the missing finalise instead. Safe from any thread, and
// whether or not MPI was ever started.
void markProcessFailing();

}  // namespace cohort::collectives
