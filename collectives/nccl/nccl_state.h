// NcclState: one rank's NCCL communicator as the nccl backend drives it (nccl_communicator.h
// describes the backend), shared by the Communicator and its Works. How one collective runs:
//
//  1. issue (the caller's thread): the collective gets the next sequence number. With a compute
//     stream, the event computeReady_ is recorded there and the communication stream waits for it
//     (cudaStreamWaitEvent: the GPU orders the two streams, the host does not wait). Then, holding
//     ncclMutex_: the conversions of a bf16 reduction (widened to fp32 before, rounded after), the
//     NCCL call, polling ncclCommGetAsyncError while the non-blocking communicator says
//     ncclInProgress (bounded by the timeout), and the copies after it. Finally a fresh `done`
//     event is recorded on the communication stream and handed to the watchdog with the
//     collective's fingerprint.
//  2. the watchdog thread probes every pending `done` event and ncclCommGetAsyncError; on a
//     timeout or an error it calls ncclCommAbort (holding ncclMutex_, so never during an NCCL call of
//     the issuing thread) and records the error that every later call rethrows.
//  3. Work::wait (nccl_communicator.cc): with a compute stream, cudaStreamWaitEvent(compute, done)
//     and return; without, poll the event from the host (spin, yield, then sleep up to 1 ms) until
//     the timeout.
// Any error poisons the state: every later issue, done() and wait() rethrows it.
// Ownership: owns the NCCL communicator (ncclCommDestroy after ncclCommFinalize, or ncclCommAbort),
// the communication stream, the scratch memory and the watchdog.
// Thread safety: issue from one thread; the watchdog's hooks take ncclMutex_.
// Only built with CUDA and NCCL.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "collectives/communicator.h"
#include "collectives/nccl/nccl_init.h"
#include "collectives/watchdog.h"
#include "runtime/stream.h"

namespace cohort::collectives::nccl {

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

inline ncclDataType_t ncclType(runtime::DType dtype) {
  return dtype == runtime::DType::kBF16 ? ncclBfloat16 : ncclFloat;
}
ncclRedOp_t ncclOp(ReduceOp op);
std::string seconds(std::chrono::milliseconds d);  // "2.5 s"

class NcclState {
 public:
  // Takes over setup.comm (ready); the rank and size are options.world's.
  NcclState(const CommunicatorOptions& options, NcclSetup setup);
  ~NcclState();
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_.index; }
  const runtime::Stream& commStream() const { return commStream_; }
  const runtime::Stream* computeStream() const { return computeStream_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  float* scratch() const { return scratch_; }

  // Device fp32 space of at least `count` floats for a bf16 reduction, kept and grown (its old
  // memory freed with cudaFree, which waits for the device: earlier collectives may use it).
  float* wideScratch(size_t count);

  // The watchdog's error first (it names the stuck collective), then one of this thread's.
  void rethrowIfFailed() const {
    watchdog_->rethrowIfFailed();
    if (error_) std::rethrow_exception(error_);
  }

  // Step 1 of the file comment. Returns the collective's completion event.
  std::shared_ptr<runtime::Event> issue(Fingerprint& fingerprint, const Launch& launch);
  // After a collective's event completed on the host: an NCCL error it may have ended with.
  void checkAsyncError(const Fingerprint& fingerprint);
  // ncclCommSplit (color NCCL_SPLIT_NOCOLOR: no group, nullptr), non-blocking and polled up to the
  // timeout (then aborted: TimeoutError). Every rank must have arrived: it has no bound of its own.
  NcclSetup split(int color, int key);

 private:
  cudaStream_t stream() const { return static_cast<cudaStream_t>(commStream_.native()); }
  void enqueueHoldingLock(const Fingerprint& fingerprint, const Launch& launch);
  CollectiveWatchdog::ProbeFn probeFor(std::shared_ptr<runtime::Event> done) const;
  // The watchdog's asyncError hook. Skips a round while the issuing thread is inside NCCL.
  std::string asyncError();
  void abortHoldingLock();
  // ncclCommFinalize flushes what is still enqueued; false when it fails or runs out of time.
  bool finalize();

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

}  // namespace cohort::collectives::nccl
