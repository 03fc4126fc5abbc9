// Stream and Event: where device work is ordered, and how two orders meet.
//
// A Stream is an in-order queue of work on one device. Functions that enqueue GPU work take a
// `Stream&` (docs/architecture.md, "The decisions that shape everything", item 4); cross-stream
// order uses Events, never a device-wide sync.
//   CPU stream:  work runs inline on the calling thread, so there is nothing to wait for:
//                synchronize() returns at once, query() is true, recording an Event is a no-op.
//   CUDA stream: RAII over a non-blocking cudaStream_t (it does not synchronise with the legacy
//                default stream), created on its device and destroyed with the Stream.
// An Event marks a point in a stream. It is created lazily by the first record() on a CUDA stream
// (on that stream's device), with timing disabled unless EventOptions::enableTiming is set.
// Every host-side wait takes a timeout (docs/architecture.md, "The decisions that shape
// everything", item 5): synchronize() polls cudaStreamQuery / cudaEventQuery with a short, growing
// sleep and throws TimeoutError naming the stream or event and its device when the time runs out;
// CUDA failures throw cohort::Error (see cuda/cuda_check.h).
//
// Ownership: a Stream owns its cudaStream_t, an Event its cudaEvent_t; copy is deleted. Moving
// transfers the handle and leaves the source an inline CPU stream / an unrecorded event.
// Thread safety: a Stream may be used from several threads (CUDA stream calls are thread-safe).
// An Event must not be recorded from two threads at once; query/synchronize are safe to share.
// Construction without CUDA compiled in: a CUDA device throws InvalidArgument.
//
//   Stream compute(Device::cuda(0), {.name = "compute"});
//   Stream comm(Device::cuda(0), {.name = "comm"});
//   Event gradsReady;
//   gradsReady.record(compute);   // after backward's kernels
//   comm.waitEvent(gradsReady);   // all-reduce starts only after them, host does not block
//   comm.synchronize(std::chrono::seconds(30));
#pragma once

#include <chrono>
#include <string>

#include "runtime/device.h"

namespace cohort::runtime {

// Default for waits whose caller has no better bound: long enough for any single step.
inline constexpr std::chrono::milliseconds kDefaultSyncTimeout = std::chrono::minutes(5);

class Event;

struct StreamOptions {
  std::string name = "stream";  // appears in error messages ("compute", "comm", "copy")
  int priority = 0;             // CUDA stream priority (lower is more urgent); ignored on CPU
};

class Stream {
 public:
  // An inline CPU stream.
  Stream() : Stream(Device::cpu(), StreamOptions{}) {}
  explicit Stream(Device device) : Stream(device, StreamOptions{}) {}
  Stream(Device device, StreamOptions options);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;

  Device device() const { return device_; }
  const std::string& name() const { return name_; }
  // "stream 'compute' on cuda:0", for messages.
  std::string describe() const;
  // The cudaStream_t as void* (cast it in CUDA code); nullptr for a CPU stream.
  void* native() const { return native_; }

  // True when all work enqueued so far has finished. Never blocks.
  bool query() const;
  // Blocks until all work enqueued so far has finished; throws TimeoutError after `timeout`.
  void synchronize(std::chrono::milliseconds timeout = kDefaultSyncTimeout) const;
  // Work enqueued on this stream after this call starts only after `event` completes. Does not
  // block the host for a CUDA stream; a CPU stream (inline work) waits for the event on the host.
  // An event never recorded is already complete.
  void waitEvent(const Event& event) const;

 private:
  Device device_;
  std::string name_;
  void* native_ = nullptr;
};

struct EventOptions {
  bool enableTiming = false;  // needed for elapsedMs(); costs a little on every record
};

class Event {
 public:
  Event() : Event(EventOptions{}) {}
  explicit Event(EventOptions options);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;

  // Marks the current end of `stream`. Re-recording moves the mark. An event belongs to the device
  // of the first CUDA stream it is recorded on; recording it on another device throws
  // InvalidArgument.
  void record(const Stream& stream);
  // True when the recorded work has finished (or nothing CUDA was ever recorded). Never blocks.
  bool query() const;
  // Blocks until the recorded work has finished; throws TimeoutError after `timeout`.
  void synchronize(std::chrono::milliseconds timeout = kDefaultSyncTimeout) const;
  // Milliseconds from this event to `end`; both must be recorded on CUDA streams with
  // enableTiming and have completed (else InvalidArgument / cohort::Error).
  float elapsedMs(const Event& end) const;

  bool recorded() const { return recorded_; }
  // The device of the stream it was last recorded on (cpu before any CUDA record).
  Device device() const { return device_; }
  // The cudaEvent_t as void*; nullptr until recorded on a CUDA stream.
  void* native() const { return native_; }
  std::string describe() const;

 private:
  EventOptions options_;
  Device device_;
  std::string streamName_;  // the stream it was last recorded on, for messages
  void* native_ = nullptr;
  bool recorded_ = false;
};

}  // namespace cohort::runtime
