// Streams, events and kernel launches as cudasim emulates them (include/cuda_runtime.h).
//
// Streams are in-order queues, each run by a thread of its own that waits a random few
// microseconds before each operation. Events carry generations: a wait on a stream waits for the
// generation recorded when the wait was enqueued.
#include <algorithm>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "cudasim/capture.h"
#include "cudasim/runtime.h"
#include "cudasim/sim.h"

namespace cudasim {
namespace {

void workerLoop(CUstream_st* s) {
  for (;;) {
    std::function<void()> op;
    {
      std::unique_lock lock(s->m);
      s->cv.wait(lock, [&] { return s->stopping || !s->queue.empty(); });
      if (s->queue.empty()) break;
      op = std::move(s->queue.front());
      s->queue.pop_front();
    }
    if (const unsigned delay = config().delayUs) {
      std::this_thread::sleep_for(std::chrono::microseconds(s->rng() % (delay + 1)));
    }
    op();
    {
      std::lock_guard lock(s->m);
      ++s->done;
    }
    s->cv.notify_all();
  }
  delete s;  // a destroyed stream goes once its work is done
}

CUstream_st* newStream(int device, unsigned flags) {
  auto* s = new CUstream_st;
  s->device = device;
  s->flags = flags;
  s->rng.seed(nextSeed());
  std::thread(workerLoop, s).detach();
  return s;
}

bool validEvent(cudaEvent_t e) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  return r.events.count(e) != 0;
}

}  // namespace

CUstream_st* resolve(cudaStream_t stream) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  if (!stream || stream == cudaStreamLegacy) {
    CUstream_st*& d = r.defaults[tlsDevice];
    if (!d) d = newStream(tlsDevice, cudaStreamDefault);
    return d;
  }
  return r.streams.count(stream) ? stream : nullptr;
}

uint64_t push(CUstream_st* s, std::function<void()> op) {
  if (captureTake(s, op)) return 0;
  std::lock_guard lock(s->m);
  s->queue.push_back(std::move(op));
  const uint64_t ticket = ++s->enqueued;
  s->cv.notify_all();
  return ticket;
}

void waitFor(CUstream_st* s, uint64_t ticket) {
  std::unique_lock lock(s->m);
  s->cv.wait(lock, [&] { return s->done >= ticket; });
}

void synchronizeStream(CUstream_st* s) {
  uint64_t ticket;
  {
    std::lock_guard lock(s->m);
    ticket = s->enqueued;
  }
  waitFor(s, ticket);
}

std::vector<CUstream_st*> streamsOf(int device) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  std::vector<CUstream_st*> all;
  for (CUstream_st* s : r.streams) {
    if (s->device == device) all.push_back(s);
  }
  if (r.defaults[device]) all.push_back(r.defaults[device]);
  return all;
}

cudaError_t enqueue(cudaStream_t stream, std::function<void()> op) {
  CUstream_st* s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = captureCheck(s, CaptureUse::kStreamWork, tlsDevice)) return fail(e);
  push(s, std::move(op));
  return cudaSuccess;
}

void launchKernel(const LaunchConfig& c, std::function<void()> body) {
  const uint64_t threads = uint64_t{c.block.x} * c.block.y * c.block.z;
  if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || threads == 0 || threads > 1024 || c.block.z > 64 ||
      c.grid.y > 65535 || c.grid.z > 65535 || c.sharedBytes > 48 * 1024) {
    fail(cudaErrorInvalidConfiguration);
    return;
  }
  CUstream_st* s = resolve(c.stream);
  if (!s) {
    fail(cudaErrorInvalidResourceHandle);
    return;
  }
  if (cudaError_t e = captureCheck(s, CaptureUse::kStreamWork, tlsDevice)) {
    fail(e);
    return;
  }
  const uint64_t seed = nextSeed();
  push(s, [c, body = std::move(body), seed] { runGrid(c, body, seed); });
}

}  // namespace cudasim

using namespace cudasim;

extern "C" {

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int) {
  if (!stream || (flags & ~1u)) return fail(cudaErrorInvalidValue);
  if (deviceCount() == 0) return fail(cudaErrorNoDevice);
  CUstream_st* s = newStream(tlsDevice, flags);
  Registry& r = registry();
  std::lock_guard lock(r.m);
  r.streams.insert(s);
  *stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return cudaStreamCreateWithPriority(stream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithPriority(stream, 0, 0); }

cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  if (leastPriority) *leastPriority = 0;
  if (greatestPriority) *greatestPriority = -5;
  return cudaSuccess;
}

// Returns at once; the stream's work still runs to its end, then the stream goes.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Registry& r = registry();
  {
    std::lock_guard lock(r.m);
    if (!stream || !r.streams.erase(stream)) return fail(cudaErrorInvalidResourceHandle);
  }
  // Notified under the lock: once it is released the worker may finish the queue and delete the stream.
  std::lock_guard lock(stream->m);
  stream->stopping = true;
  stream->cv.notify_all();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = captureCheck(s, CaptureUse::kStreamWait, tlsDevice)) return fail(e);
  synchronizeStream(s);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = captureCheck(s, CaptureUse::kStreamWait, tlsDevice)) return fail(e);
  std::lock_guard lock(s->m);
  return s->done == s->enqueued ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamGetFlags(cudaStream_t stream, unsigned int* flags) {
  CUstream_st* s = resolve(stream);
  if (!s || !flags) return fail(!s ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
  *flags = s->flags;
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  CUstream_st* s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!validEvent(event)) return fail(cudaErrorInvalidResourceHandle);
  bool captured = false;
  if (cudaError_t e = captureEventWait(s, event, captured)) return fail(e);
  if (captured) return cudaSuccess;
  uint64_t generation;
  {
    std::lock_guard lock(event->m);
    generation = event->recorded;  // what was recorded when the wait was enqueued, as CUDA specifies
  }
  if (generation == 0) return cudaSuccess;  // never recorded: nothing to wait for
  push(s, [event, generation] {
    std::unique_lock lock(event->m);
    event->cv.wait(lock, [&] { return event->completed >= generation; });
  });
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  if (!fn) return fail(cudaErrorInvalidValue);
  return enqueue(stream, [fn, userData] { fn(userData); });
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (!event || (flags & ~3u)) return fail(cudaErrorInvalidValue);
  auto* e = new CUevent_st;
  e->flags = flags;
  Registry& r = registry();
  std::lock_guard lock(r.m);
  r.events.insert(e);
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

// An event is destroyed at once; a wait already enqueued on it still completes (its generation is
// kept by the stream's operation, which the event outlives: events are never freed).
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  if (!event || !r.events.erase(event)) return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!validEvent(event)) return fail(cudaErrorInvalidResourceHandle);
  CUstream_st* s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = captureCheck(s, CaptureUse::kStreamWork, tlsDevice)) return fail(e);
  if (captureEventRecord(event, s)) return cudaSuccess;
  uint64_t generation;
  {
    std::lock_guard lock(event->m);
    generation = ++event->recorded;
  }
  push(s, [event, generation] {
    {
      std::lock_guard lock(event->m);
      event->completed = std::max(event->completed, generation);
      event->time = std::chrono::steady_clock::now();
    }
    event->cv.notify_all();
  });
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!validEvent(event)) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = captureEventUse(event)) return fail(e);
  std::lock_guard lock(event->m);
  return event->completed >= event->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!validEvent(event)) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = captureEventUse(event)) return fail(e);
  std::unique_lock lock(event->m);
  const uint64_t generation = event->recorded;
  event->cv.wait(lock, [&] { return event->completed >= generation; });
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return fail(cudaErrorInvalidValue);
  if (!validEvent(start) || !validEvent(end)) return fail(cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
  std::scoped_lock lock(start->m, end->m);
  if (start->recorded == 0 || end->recorded == 0) return fail(cudaErrorInvalidResourceHandle);
  if (start->completed < start->recorded || end->completed < end->recorded) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return cudaSuccess;
}

}  // extern "C"
