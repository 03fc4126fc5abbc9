// What cudasim's runtime (runtime.cc) asks of its stream captures (graph.cc): private to cudasim.
//
// Every API call that enqueues on a stream, waits for one, waits for the device or is "potentially
// unsafe" during a capture (CUDA's term: cudaMalloc) asks captureCheck first; a call CUDA forbids
// fails with CUDA's error and invalidates the capture it conflicts with. An operation enqueued on a
// capturing stream is taken into the capture (captureTake) instead of the stream's queue.
// Thread safety: all functions may be called from any host thread (graph.cc's one mutex).
#pragma once

#include <functional>

#include "cuda_runtime.h"

struct CUevent_st;

namespace cudasim {

enum class CaptureUse {
  kStreamWork,    // enqueues work on the stream
  kStreamWait,    // waits for or queries the stream (cudaStreamSynchronize, cudaStreamQuery)
  kDeviceWait,    // waits for the device (cudaDeviceSynchronize, cudaFree, cudaMemcpy, cudaMemset)
  kUnsafe,        // potentially unsafe (cudaMalloc, pinned host allocations)
  kPageableCopy,  // an asynchronous copy to or from pageable host memory on the stream
};

// cudaSuccess, or the error the call must fail with (the conflicting captures are invalidated).
// `stream` is the resolved stream of the call (nullptr for calls without one), `device` the
// calling thread's current device.
cudaError_t captureCheck(cudaStream_t stream, CaptureUse use, int device);
// Takes `op` into the capture of `stream` (true), or leaves it to the stream (false). An op of an
// invalidated capture is dropped (true): CUDA does not run it either.
bool captureTake(cudaStream_t stream, std::function<void()>& op);
// cudaEventRecord on a capturing stream: the event becomes a node of the capture (true); false
// when `stream` does not capture.
bool captureEventRecord(cudaEvent_t event, cudaStream_t stream);
// cudaStreamWaitEvent: `handled` when the capture decided it (a stream joining the capture of the
// event, or an in-capture dependency); an error for an event outside a capturing stream's capture.
cudaError_t captureEventWait(cudaStream_t stream, cudaEvent_t event, bool& handled);
// cudaEventQuery / cudaEventSynchronize: cudaErrorCapturedEvent for an event last recorded by a capture.
cudaError_t captureEventUse(cudaEvent_t event);

// From runtime.cc: the live stream an API call names (nullptr: the current device's default
// stream), or nullptr; its device; the calling thread's device; the last-error setter.
cudaStream_t resolveStream(cudaStream_t stream);
int streamDevice(cudaStream_t stream);
int currentDevice();
cudaError_t failWith(cudaError_t error);

}  // namespace cudasim
