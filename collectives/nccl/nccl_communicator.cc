// The NCCL backend. How one collective runs (docs/collectives.md, "NCCL backend"):
//
//  1. issue (the caller's thread): the collective gets the next sequence number. With a compute
//     stream, the event computeReady_ is recorded there and the communication stream waits for it
//     (cudaStreamWaitEvent: the GPU orders the two streams, the host does not wait). Then, holding
//     ncclMutex_: the conversions of a bf16 reduction (widened to fp32 before, rounded after), the NCCL call, polling ncclCommGetAsyncError while the non-blocking communicator
//     says ncclInProgress (bounded by the timeout), and the copies after it. Finally a fresh `done`
//     event is recorded on the communication stream and handed to the watchdog with the
//     collective's fingerprint.
//  2. the watchdog thread probes every pending `done` event and ncclCommGetAsyncError; on a
//     timeout or an error it calls ncclCommAbort (holding ncclMutex_, so never during an NCCL call of
//     the issuing thread) and records the error that every later call rethrows.
//  3. Work::wait: with a compute stream, cudaStreamWaitEvent(compute, done) and return; without,
//     poll the event from the host (spin, yield, then sleep up to 1 ms) until the timeout.
// Any error poisons the communicator: every later issue, done() and wait() rethrows it.
#include "collectives/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <thread>

#include "collectives/nccl/nccl_init.h"
#include "collectives/placement.h"
#include "collectives/watchdog.h"
#include "collectives/work_pool.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/precision_kernels.h"
#include "runtime/error.h"
#include "runtime/stream.h"

namespace cohort::collectives {
namespace {

using Clock = std::chrono::steady_clock;
using nccl::NcclLibrary;
using nccl::pollWhileInProgress;
using nccl::throwNccl;

std::string seconds(std::chrono::milliseconds d) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << d.count() / 1000.0 << " s";
  return os.str();
}

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

// Small host buffers (a trainer's scalars: loss averages, stop flags) are staged through the device
// scratch: copied in on the communication stream at issue (cudaMemcpyAsync from pageable memory
// takes the values at once), reduced there, and copied out by Work::wait once the host has seen the
// collective finish. Floats [0, kStagingOffset) of the scratch belong to barrier().
constexpr size_t kStagingOffset = 16;
constexpr size_t kHostStagingFloats = 32;
constexpr size_t kScratchBytes = 256;
static_assert((kStagingOffset + kHostStagingFloats) * sizeof(float) <= kScratchBytes);

// The NCCL call of a collective, given the library, the communicator and the stream.
using NcclCall = std::function<ncclResult_t(const NcclLibrary&, ncclComm_t, cudaStream_t)>;

// What one collective enqueues on the communication stream, in this order.
struct Launch {
  std::function<void(cudaStream_t)> before = {};  // device copies; may be empty
  NcclCall call = {};                             // the NCCL collective; may be empty
  std::function<void(cudaStream_t)> after = {};   // device copies; may be empty
};

ncclDataType_t ncclType(runtime::DType dtype) { return dtype == runtime::DType::kBF16 ? ncclBfloat16 : ncclFloat; }

// Zeroed device memory from cudaMalloc, freed with the Buffer.
class DeviceBuffer : public Buffer {
 public:
  static std::unique_ptr<DeviceBuffer> allocate(size_t count, const runtime::Stream& stream,
                                                std::chrono::milliseconds timeout) {
    const int device = stream.device().index;
    runtime::cuda::CudaDeviceGuard guard(device);
    const size_t bytes = std::max<size_t>(256, count * sizeof(float));
    void* p = nullptr;
    COHORT_CUDA_CHECK(cudaMalloc(&p, bytes));
    std::unique_ptr<DeviceBuffer> buffer(new DeviceBuffer(static_cast<float*>(p), count, device));
    // Zeroed on the communication stream, so the collectives that use the buffer come after.
    COHORT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, static_cast<cudaStream_t>(stream.native())));
    stream.synchronize(timeout);
    return buffer;
  }
  ~DeviceBuffer() override {
    runtime::cuda::QuietDeviceGuard guard(device_);
    cudaFree(data());
  }

 private:
  DeviceBuffer(float* data, size_t count, int device) : Buffer(data, count), device_(device) {}
  int device_;
};

// Everything the communicator and its Works share.
class NcclState {
 public:
  NcclState(const CommunicatorOptions& options, nccl::NcclSetup setup)
      : rank_(options.world.rank),
        size_(options.world.worldSize),
        device_(runtime::Device::cuda(setup.device)),
        timeout_(options.timeout),
        computeStream_(options.computeStream),
        commStream_(device_, {.name = "nccl"}),
        nccl_(std::move(setup.nccl)),
        comm_(setup.comm) {
    runtime::cuda::CudaDeviceGuard guard(device_.index);
    void* scratch = nullptr;
    COHORT_CUDA_CHECK(cudaMalloc(&scratch, kScratchBytes));
    scratch_ = static_cast<float*>(scratch);
    try {
      // Zero, so the barrier's in-place sum stays 0 forever.
      COHORT_CUDA_CHECK(cudaMemsetAsync(scratch_, 0, kScratchBytes, stream()));
      commStream_.synchronize(timeout_);
    } catch (...) {
      cudaFree(scratch_);  // no destructor runs for a constructor that throws
      throw;
    }
    watchdog_ = std::make_unique<CollectiveWatchdog>(
        CollectiveWatchdog::Hooks{.asyncError = [this] { return asyncError(); },
                                  .abort =
                                      [this] {
                                        std::lock_guard<std::mutex> lock(ncclMutex_);
                                        abortHoldingLock();
                                      }},
        CollectiveWatchdog::Options{.timeout = timeout_, .rank = rank_, .backend = "nccl"});
  }

  ~NcclState() {
    watchdog_.reset();  // from here on no hook runs
    runtime::cuda::QuietDeviceGuard guard(device_.index);
    if (!aborted_) {
      if (!error_ && finalize())
        nccl_->commDestroy(comm_);
      else
        nccl_->commAbort(comm_);
    }
    cudaFree(scratch_);
    if (wide_ != nullptr) cudaFree(wide_);
    // computeReady_ and commStream_ go with the members; `done` events with the last Work.
  }

  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const runtime::Stream& commStream() const { return commStream_; }
  const runtime::Stream* computeStream() const { return computeStream_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  float* scratch() const { return scratch_; }

  // Device fp32 space of at least `count` floats for a bf16 reduction, kept and grown (its old
  // memory freed with cudaFree, which waits for the device: earlier collectives may use it).
  float* wideScratch(size_t count) {
    if (count > wideCount_) {
      runtime::cuda::CudaDeviceGuard guard(device_.index);
      if (wide_ != nullptr) COHORT_CUDA_CHECK(cudaFree(wide_));
      wide_ = nullptr;
      wideCount_ = 0;
      void* p = nullptr;
      COHORT_CUDA_CHECK(cudaMalloc(&p, count * sizeof(float)));
      wide_ = static_cast<float*>(p);
      wideCount_ = count;
    }
    return wide_;
  }

  // The watchdog's error first (it names the stuck collective), then one of this thread's.
  void rethrowIfFailed() const {
    watchdog_->rethrowIfFailed();
    if (error_) std::rethrow_exception(error_);
  }

  // Step 1 of the file comment. Returns the collective's completion event.
  std::shared_ptr<runtime::Event> issue(Fingerprint& fingerprint, const Launch& launch) {
    rethrowIfFailed();
    fingerprint.sequence = nextSequence_++;
    runtime::cuda::CudaDeviceGuard guard(device_.index);
    auto done = std::make_shared<runtime::Event>();
    {
      std::lock_guard<std::mutex> lock(ncclMutex_);
      if (aborted_) {
        rethrowIfFailed();
        COHORT_THROW(PeerError) << "nccl " << fingerprint.str() << ": the communicator of rank " << rank_
                                << " was aborted";
      }
      try {
        if (computeStream_ != nullptr) {
          computeReady_.record(*computeStream_);
          commStream_.waitEvent(computeReady_);
        }
        enqueueHoldingLock(fingerprint, launch);
        done->record(commStream_);
      } catch (...) {
        // A collective this rank could not enqueue leaves its peers waiting: abort at once.
        if (!error_) error_ = std::current_exception();
        abortHoldingLock();
        throw;
      }
    }
    watchdog_->track(fingerprint, probeFor(done));
    return done;
  }

  // After a collective's event completed on the host: an NCCL error it may have ended with.
  void checkAsyncError(const Fingerprint& fingerprint) {
    std::lock_guard<std::mutex> lock(ncclMutex_);
    if (aborted_) {
      // The watchdog aborted meanwhile (it records its error first): the result is not valid.
      rethrowIfFailed();
      COHORT_THROW(PeerError) << "nccl " << fingerprint.str() << ": the communicator of rank " << rank_
                              << " was aborted";
    }
    ncclResult_t state = ncclSuccess;
    if (nccl_->commGetAsyncError(comm_, &state) != ncclSuccess || state == ncclSuccess || state == ncclInProgress) {
      return;
    }
    std::ostringstream os;
    os << "nccl " << fingerprint.str() << " failed on rank " << rank_ << ": " << nccl::ncclMessage(*nccl_, state, comm_)
       << "; the communicator was aborted";
    error_ = std::make_exception_ptr(PeerError(os.str()));
    abortHoldingLock();
    std::rethrow_exception(error_);
  }

 private:
  cudaStream_t stream() const { return static_cast<cudaStream_t>(commStream_.native()); }

  void enqueueHoldingLock(const Fingerprint& fingerprint, const Launch& launch) {
    if (launch.before) launch.before(stream());
    if (launch.call) {
      ncclResult_t result = launch.call(*nccl_, comm_, stream());
      if (result == ncclInProgress) {
        // Non-blocking: NCCL finishes enqueueing in the background; the stream holds the kernel
        // only once the state leaves ncclInProgress.
        std::optional<ncclResult_t> state = pollWhileInProgress(*nccl_, comm_, Clock::now() + timeout_);
        if (!state) {
          COHORT_THROW(TimeoutError) << "nccl " << fingerprint.str() << ": NCCL did not finish enqueueing it within "
                                     << seconds(timeout_) << " on rank " << rank_ << "; the communicator was aborted";
        }
        result = *state;
      }
      if (result != ncclSuccess) throwNccl(*nccl_, result, fingerprint.str(), rank_, comm_);
    }
    if (launch.after) launch.after(stream());
  }

  CollectiveWatchdog::ProbeFn probeFor(std::shared_ptr<runtime::Event> done) const {
    const int device = device_.index;
    return [done = std::move(done), device] {
      // The watchdog thread's current device: ours, so that CUDA never creates a context for it
      // on device 0 (cheap once set).
      cudaSetDevice(device);
      try {
        CollectiveWatchdog::Probe probe;
        probe.state = done->query() ? CollectiveWatchdog::State::kDone : CollectiveWatchdog::State::kPending;
        return probe;
      } catch (const std::exception& e) {
        return CollectiveWatchdog::Probe{CollectiveWatchdog::State::kFailed, e.what()};
      }
    };
  }

  // The watchdog's asyncError hook. Skips a round while the issuing thread is inside NCCL.
  std::string asyncError() {
    std::unique_lock<std::mutex> lock(ncclMutex_, std::try_to_lock);
    if (!lock.owns_lock() || aborted_) return "";
    cudaSetDevice(device_.index);
    ncclResult_t state = ncclSuccess;
    if (ncclResult_t r = nccl_->commGetAsyncError(comm_, &state); r != ncclSuccess) {
      return std::string("ncclCommGetAsyncError failed: ") + nccl_->getErrorString(r);
    }
    if (state == ncclSuccess || state == ncclInProgress) return "";
    return nccl::ncclMessage(*nccl_, state, comm_);
  }

  void abortHoldingLock() {
    if (aborted_) return;
    cudaSetDevice(device_.index);
    nccl_->commAbort(comm_);  // blocks until NCCL's kernels have returned and its resources are freed
    aborted_ = true;
  }

  // ncclCommFinalize flushes what is still enqueued; false when it fails or runs out of time.
  bool finalize() {
    ncclResult_t result = nccl_->commFinalize(comm_);
    if (result == ncclInProgress || result == ncclSuccess) {
      std::optional<ncclResult_t> state = pollWhileInProgress(*nccl_, comm_, Clock::now() + timeout_);
      return state && *state == ncclSuccess;
    }
    return false;
  }

  const int rank_;
  const int size_;
  const runtime::Device device_;
  const std::chrono::milliseconds timeout_;
  const runtime::Stream* computeStream_;  // not owned; may be null
  runtime::Stream commStream_;
  runtime::Event computeReady_;  // re-recorded per collective: a stream wait copies its state at once
  const std::shared_ptr<const NcclLibrary> nccl_;
  ncclComm_t comm_;
  float* scratch_ = nullptr;  // a zero float for barrier(), then the host staging area
  float* wide_ = nullptr;     // bf16 reductions in fp32 (wideScratch)
  size_t wideCount_ = 0;
  uint64_t nextSequence_ = 0;
  std::exception_ptr error_;                      // the issuing thread's own failure (under ncclMutex_ when written)
  std::mutex ncclMutex_;                          // around every use of comm_ by the issuing thread and the watchdog
  bool aborted_ = false;                          // under ncclMutex_
  std::unique_ptr<CollectiveWatchdog> watchdog_;  // last: its thread uses everything above
};

// A host-staged collective's result (see kHostStagingFloats): `count` floats from the staging area
// to `output`, copied by Work::wait once the collective is done.
struct HostCopy {
  bool staged = false;  // false: a collective on device memory, nothing to copy
  const float* staging = nullptr;
  float* output = nullptr;
  size_t count = 0;
};

// Pooled by the communicator (work_pool.h). Its `done` event is one per collective: the watchdog
// may still probe it after the Work has gone.
class NcclWork : public PooledWork {
 public:
  NcclWork(std::shared_ptr<NcclState> state, int device) : state_(std::move(state)), device_(device) {}

  // A staged collective's wait() always waits on the host, with or without a compute stream.
  void start(std::shared_ptr<runtime::Event> done, const Fingerprint& fingerprint, const HostCopy& copyOut = {}) {
    done_ = std::move(done);
    fingerprint_ = fingerprint;
    copyOut_ = copyOut;
  }

  bool done() override {
    state_->rethrowIfFailed();
    if (!done_->query()) return false;
    state_->checkAsyncError(fingerprint_);
    return true;
  }

  // The stream waits for the done event (no host wait), as wait() with a compute stream does; a
  // host-staged collective's result arrives only through the host, so that one waits there.
  void waitOn(const runtime::Stream& stream, std::chrono::milliseconds timeout) override {
    state_->rethrowIfFailed();
    if (copyOut_.staged) return wait(timeout);
    if (stream.device().index != device_) {
      COHORT_THROW(InvalidArgument) << "nccl " << fingerprint_.str() << ": Work::waitOn got a stream on cuda:"
                                    << stream.device().index << ", but rank " << state_->rank() << " runs on cuda:" << device_;
    }
    stream.waitEvent(*done_);
  }

  void wait(std::chrono::milliseconds timeout) override {
    state_->rethrowIfFailed();
    const runtime::Stream* compute = state_->computeStream();
    if (compute && !copyOut_.staged) {
      compute->waitEvent(*done_);  // the GPU orders the caller's next kernels after the collective
      return;
    }
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline = start + timeout;
    std::chrono::microseconds sleep{0};
    while (!done_->query()) {
      state_->rethrowIfFailed();
      const Clock::time_point now = Clock::now();
      if (now >= deadline) {
        COHORT_THROW(TimeoutError) << "nccl " << fingerprint_.str() << " did not complete within " << seconds(timeout)
                                   << " on rank " << state_->rank()
                                   << " (Work::wait); the watchdog aborts the communicator if it is still pending "
                                   << seconds(state_->timeout()) << " after it was issued";
      }
      // Spin for the first 100 us (small collectives end there), yield up to 2 ms, then sleep.
      if (now - start < std::chrono::microseconds(100)) continue;
      if (now - start < std::chrono::milliseconds(2)) {
        std::this_thread::yield();
        continue;
      }
      sleep = std::min(std::chrono::microseconds(1000), sleep + std::chrono::microseconds(50));
      std::this_thread::sleep_for(sleep);
    }
    state_->rethrowIfFailed();
    state_->checkAsyncError(fingerprint_);
    if (copyOut_.staged) {
      if (copyOut_.count > 0) {
        runtime::cuda::CudaDeviceGuard guard(device_);
        COHORT_CUDA_CHECK(
            cudaMemcpy(copyOut_.output, copyOut_.staging, copyOut_.count * sizeof(float), cudaMemcpyDeviceToHost));
      }
      copyOut_ = {};
    }
  }

 private:
  std::shared_ptr<NcclState> state_;
  int device_;
  std::shared_ptr<runtime::Event> done_;
  Fingerprint fingerprint_;
  HostCopy copyOut_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclState> state, int device) : state_(std::move(state)), device_(device) {}

  int rank() const override { return state_->rank(); }
  int size() const override { return state_->size(); }
  std::string backend() const override { return "nccl"; }

  WorkPtr allReduce(const void* input, void* output, size_t count, const AllReduceOptions& options) override {
    const Fingerprint fingerprint{.kind = CollectiveKind::kAllReduce, .op = options.op, .dtype = options.dtype, .count = count};
    const ncclRedOp_t op = ncclOp(options.op);
    if (options.dtype == runtime::DType::kF32 && isSmallHostBuffer(input, count) && isSmallHostBuffer(output, count)) {
      float* staging = state_->scratch() + kStagingOffset;
      return startStaged(fingerprint, static_cast<const float*>(input), static_cast<float*>(output), count,
                         [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
                           return nccl.allReduce(staging, staging, count, ncclFloat, op, comm, s);
                         });
    }
    checkDevicePointer(input, count, "allReduce", "input");
    checkDevicePointer(output, count, "allReduce", "output");
    if (options.dtype == runtime::DType::kBF16) return reduceWidened(fingerprint, input, output, count, count);
    return start(fingerprint, {.call = [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
                   return nccl.allReduce(input, output, count, ncclFloat, op, comm, s);
                 }});
  }

  // NCCL's in place (output == input + rank*countPerRank) is what NCCL takes as it is: no copies.
  WorkPtr reduceScatter(const void* input, void* output, size_t countPerRank,
                        const ReduceScatterOptions& options) override {
    reduceScatterPlacement(input, output, countPerRank, options.dtype, rank(), size());
    checkDevicePointer(input, countPerRank, "reduceScatter", "input");
    checkDevicePointer(output, countPerRank, "reduceScatter", "output");
    const Fingerprint fingerprint{
        .kind = CollectiveKind::kReduceScatter, .op = options.op, .dtype = options.dtype, .count = countPerRank};
    if (options.dtype == runtime::DType::kBF16) {
      return reduceWidened(fingerprint, input, output, countPerRank * static_cast<size_t>(size()), countPerRank);
    }
    const ncclRedOp_t op = ncclOp(options.op);
    return start(fingerprint, {.call = [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
                   return nccl.reduceScatter(input, output, countPerRank, ncclFloat, op, comm, s);
                 }});
  }

  // NCCL's in place (input == output + rank*countPerRank) as it is.
  WorkPtr allGather(const void* input, void* output, size_t countPerRank, const AllGatherOptions& options) override {
    allGatherPlacement(input, output, countPerRank, options.dtype, rank(), size());
    checkDevicePointer(input, countPerRank, "allGather", "input");
    checkDevicePointer(output, countPerRank, "allGather", "output");
    const Fingerprint fingerprint{.kind = CollectiveKind::kAllGather, .dtype = options.dtype, .count = countPerRank};
    const ncclDataType_t type = ncclType(options.dtype);
    return start(fingerprint, {.call = [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
                   return nccl.allGather(input, output, countPerRank, type, comm, s);
                 }});
  }

  WorkPtr broadcast(void* data, size_t count, const BroadcastOptions& options) override {
    checkRoot(options.root, size());
    const int root = options.root;
    const Fingerprint fingerprint{.kind = CollectiveKind::kBroadcast, .dtype = options.dtype, .root = root, .count = count};
    if (options.dtype == runtime::DType::kF32 && isSmallHostBuffer(data, count)) {
      float* staging = state_->scratch() + kStagingOffset;
      float* host = static_cast<float*>(data);
      return startStaged(fingerprint, host, host, count, [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
        return nccl.broadcast(staging, staging, count, ncclFloat, root, comm, s);
      });
    }
    checkDevicePointer(data, count, "broadcast", "data");
    const ncclDataType_t type = ncclType(options.dtype);
    return start(fingerprint, {.call = [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
                   return nccl.broadcast(data, data, count, type, root, comm, s);
                 }});
  }

  // A one-float all-reduce of a zero scratch value: every rank's stream passes it only once all have
  // issued it.
  WorkPtr barrier() override {
    float* scratch = state_->scratch();
    Fingerprint fingerprint{.kind = CollectiveKind::kBarrier};
    auto done = state_->issue(fingerprint, {.call = [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
                                return nccl.allReduce(scratch, scratch, 1, ncclFloat, ncclSum, comm, s);
                              }});
    return makeWork(std::move(done), fingerprint);
  }

  BufferPtr allocateBuffer(size_t count) override {
    state_->rethrowIfFailed();
    return DeviceBuffer::allocate(count, state_->commStream(), state_->timeout());
  }

 private:
  // A bf16 all-reduce or reduce-scatter: widened into the fp32 scratch on the communication
  // stream, reduced in fp32 by NCCL, and rounded to bf16 once (docs/collectives.md), so the bits do
  // not depend on NCCL's algorithm and match the CPU backends'. inCount / outCount: elements.
  WorkPtr reduceWidened(const Fingerprint& fingerprint, const void* input, void* output, size_t inCount, size_t outCount) {
    float* wide = state_->wideScratch(inCount + outCount);
    float* wideOut = wide + inCount;
    const runtime::Stream& stream = state_->commStream();
    const ncclRedOp_t op = ncclOp(fingerprint.op);
    const bool scatter = fingerprint.kind == CollectiveKind::kReduceScatter;
    return start(fingerprint,
                 {.before = [=, &stream](cudaStream_t) { runtime::cuda::convertToFloat(input, wide, inCount, stream); },
                  .call =
                      [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
                        return scatter ? nccl.reduceScatter(wide, wideOut, outCount, ncclFloat, op, comm, s)
                                       : nccl.allReduce(wide, wideOut, outCount, ncclFloat, op, comm, s);
                      },
                  .after = [=, &stream](cudaStream_t) { runtime::cuda::convertToBf16(wideOut, output, outCount, stream); }});
  }

  // Count 0 enqueues no NCCL call (every rank has the same count); the events still order it.
  WorkPtr start(Fingerprint fingerprint, Launch launch) {
    if (fingerprint.count == 0) launch = {};
    auto done = state_->issue(fingerprint, launch);
    return makeWork(std::move(done), fingerprint);
  }

  WorkPtr makeWork(std::shared_ptr<runtime::Event> done, const Fingerprint& fingerprint, const HostCopy& copyOut = {}) {
    PooledPtr<NcclWork> work = pool_.acquire(state_, device_);
    work->start(std::move(done), fingerprint, copyOut);
    return work;
  }

  // A host-staged collective (see kHostStagingFloats): the input goes to the staging area at issue,
  // the result comes back in Work::wait.
  WorkPtr startStaged(Fingerprint fingerprint, const float* input, float* output, size_t count, NcclCall call) {
    float* staging = state_->scratch() + kStagingOffset;
    const size_t bytes = count * sizeof(float);
    Launch launch{.before =
                      [=](cudaStream_t s) {
                        COHORT_CUDA_CHECK(cudaMemcpyAsync(staging, input, bytes, cudaMemcpyHostToDevice, s));
                      },
                  .call = std::move(call)};
    if (fingerprint.count == 0) launch = {};
    auto done = state_->issue(fingerprint, launch);
    return makeWork(std::move(done), fingerprint,
                    {.staged = true, .staging = staging, .output = output, .count = count});
  }

  // Host memory of at most kHostStagingFloats elements (pointers CUDA does not know, or pinned
  // host memory) goes through the staging area.
  static bool isSmallHostBuffer(const void* p, size_t count) {
    if (p == nullptr || count > kHostStagingFloats) return false;
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
      cudaGetLastError();
      return true;
    }
    return attributes.type == cudaMemoryTypeUnregistered || attributes.type == cudaMemoryTypeHost;
  }

  // Larger host memory handed to NCCL would fault on the GPU (or hang the peers): refuse it at issue.
  void checkDevicePointer(const void* p, size_t count, const char* collective, const char* which) const {
    if (count == 0) return;
    if (p == nullptr) {
      COHORT_THROW(InvalidArgument) << "nccl " << collective << ": the " << which << " is null for " << count
                                    << " elements";
    }
    cudaPointerAttributes attributes{};
    const cudaError_t status = cudaPointerGetAttributes(&attributes, p);
    if (status != cudaSuccess) cudaGetLastError();
    const bool onDevice =
        status == cudaSuccess && (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged);
    if (onDevice && attributes.device == device_) return;
    std::ostringstream os;
    os << "nccl " << collective << ": the " << which << " (" << p << ") is ";
    if (onDevice)
      os << "memory of cuda:" << attributes.device;
    else
      os << "host memory (beyond the " << kHostStagingFloats << " elements staged through the device)";
    os << ", but rank " << rank() << "'s nccl backend takes device memory on cuda:" << device_
       << " (Communicator::allocateBuffer gives some)";
    throw InvalidArgument(os.str());
  }

  std::shared_ptr<NcclState> state_;
  int device_;
  WorkPool<NcclWork> pool_;  // its idle Works hold state_ too; Works in use free themselves
};

}  // namespace

std::unique_ptr<Communicator> makeNcclCommunicator(const CommunicatorOptions& options) {
  nccl::NcclSetup setup = nccl::initNccl(options);
  std::shared_ptr<NcclState> state;
  try {
    state = std::make_shared<NcclState>(options, setup);
  } catch (...) {
    setup.nccl->commAbort(setup.comm);  // the state never took it over
    throw;
  }
  return std::make_unique<NcclCommunicator>(std::move(state), setup.device);
}

}  // namespace cohort::collectives
