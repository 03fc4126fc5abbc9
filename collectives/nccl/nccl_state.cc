// NcclState (nccl_state.h): the NCCL communicator of one rank, its streams, scratch and watchdog.
#include "collectives/nccl/nccl_state.h"

#include <iomanip>
#include <optional>
#include <sstream>

#include "runtime/cuda/cuda_check.h"
#include "runtime/error.h"

namespace cohort::collectives::nccl {

using Clock = std::chrono::steady_clock;

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

NcclState::NcclState(const CommunicatorOptions& options, NcclSetup setup)
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

NcclState::~NcclState() {
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

// Device fp32 space of at least `count` floats for a bf16 reduction, kept and grown (its old
// memory freed with cudaFree, which waits for the device: earlier collectives may use it).
float* NcclState::wideScratch(size_t count) {
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

// Step 1 of the file comment. Returns the collective's completion event.
std::shared_ptr<runtime::Event> NcclState::issue(Fingerprint& fingerprint, const Launch& launch) {
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
void NcclState::checkAsyncError(const Fingerprint& fingerprint) {
  std::lock_guard<std::mutex> lock(ncclMutex_);
  if (aborted_) {
    // The watchdog aborted meanwhile (it records its error first): the result is not valid.
    rethrowIfFailed();
    COHORT_THROW(PeerError) << "nccl " << fingerprint.str() << ": the communicator of rank " << rank_ << " was aborted";
  }
  ncclResult_t state = ncclSuccess;
  if (nccl_->commGetAsyncError(comm_, &state) != ncclSuccess || state == ncclSuccess || state == ncclInProgress) {
    return;
  }
  std::ostringstream os;
  os << "nccl " << fingerprint.str() << " failed on rank " << rank_ << ": " << ncclMessage(*nccl_, state, comm_)
     << "; the communicator was aborted";
  error_ = std::make_exception_ptr(PeerError(os.str()));
  abortHoldingLock();
  std::rethrow_exception(error_);
}

void NcclState::enqueueHoldingLock(const Fingerprint& fingerprint, const Launch& launch) {
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

CollectiveWatchdog::ProbeFn NcclState::probeFor(std::shared_ptr<runtime::Event> done) const {
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
std::string NcclState::asyncError() {
  std::unique_lock<std::mutex> lock(ncclMutex_, std::try_to_lock);
  if (!lock.owns_lock() || aborted_) return "";
  cudaSetDevice(device_.index);
  ncclResult_t state = ncclSuccess;
  if (ncclResult_t r = nccl_->commGetAsyncError(comm_, &state); r != ncclSuccess) {
    return std::string("ncclCommGetAsyncError failed: ") + nccl_->getErrorString(r);
  }
  if (state == ncclSuccess || state == ncclInProgress) return "";
  return ncclMessage(*nccl_, state, comm_);
}

void NcclState::abortHoldingLock() {
  if (aborted_) return;
  cudaSetDevice(device_.index);
  nccl_->commAbort(comm_);  // blocks until NCCL's kernels have returned and its resources are freed
  aborted_ = true;
}

// ncclCommFinalize flushes what is still enqueued; false when it fails or runs out of time.
bool NcclState::finalize() {
  ncclResult_t result = nccl_->commFinalize(comm_);
  if (result == ncclInProgress || result == ncclSuccess) {
    std::optional<ncclResult_t> state = pollWhileInProgress(*nccl_, comm_, Clock::now() + timeout_);
    return state && *state == ncclSuccess;
  }
  return false;
}

NcclSetup NcclState::split(int color, int key) {
  runtime::cuda::CudaDeviceGuard guard(device_.index);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t group = nullptr;
  std::lock_guard<std::mutex> lock(ncclMutex_);
  if (aborted_) COHORT_THROW(PeerError) << "nccl split: the communicator of rank " << rank_ << " was aborted";
  ncclResult_t result = nccl_->commSplit(comm_, color, key, &group, &config);
  if (result == ncclInProgress || (result == ncclSuccess && group != nullptr)) {
    const std::optional<ncclResult_t> state =
        pollWhileInProgress(*nccl_, group ? group : comm_, Clock::now() + timeout_);
    if (!state) {
      nccl_->commAbort(group);
      COHORT_THROW(TimeoutError) << "nccl split: the group of rank " << rank_ << " (color " << color
                                 << ") was not ready within " << seconds(timeout_);
    }
    result = *state;
  }
  if (result != ncclSuccess) {
    if (group != nullptr) nccl_->commAbort(group);
    throwNccl(*nccl_, result, "ncclCommSplit", rank_, comm_);
  }
  return {.nccl = nccl_, .comm = group, .device = device_.index};
}

}  // namespace cohort::collectives::nccl
