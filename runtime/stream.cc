#include "runtime/stream.h"

#include <algorithm>
#include <sstream>
#include <thread>
#include <utility>

#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"
#endif

namespace cohort::runtime {
namespace {

// Polls `done` until it returns true, sleeping 20 us at first and at most 1 ms between polls (a
// blocking-sync CUDA call would wait forever on a hung peer; this keeps every wait bounded).
template <class Done>
void pollUntil(Done done, std::chrono::milliseconds timeout, const std::string& what) {
  if (done()) return;
  auto start = std::chrono::steady_clock::now();
  auto deadline = start + timeout;
  auto sleep = std::chrono::microseconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      COHORT_THROW(TimeoutError) << "timed out after " << timeout.count() << " ms waiting for "
                                 << what << " to finish its work";
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
  }
}

#ifdef COHORT_HAVE_CUDA
cudaStream_t asStream(void* p) { return static_cast<cudaStream_t>(p); }
cudaEvent_t asEvent(void* p) { return static_cast<cudaEvent_t>(p); }

// cudaSuccess -> true, cudaErrorNotReady -> false, anything else throws.
bool readyOrThrow(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return true;
  if (status == cudaErrorNotReady) {
    cudaGetLastError();  // "not ready" is not a failure; keep it out of the next launch check
    return false;
  }
  cuda::throwCudaError(status, call, __FILE__, __LINE__);
}
#endif

}  // namespace

// ---- Stream ----

Stream::Stream(Device device, StreamOptions options)
    : device_(device), name_(std::move(options.name)) {
  if (device_.isCpu()) return;
#ifdef COHORT_HAVE_CUDA
  cuda::CudaDeviceGuard guard(device_.index);
  cudaStream_t stream = nullptr;
  COHORT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, options.priority));
  native_ = stream;
#else
  COHORT_THROW(InvalidArgument) << "cannot create " << describe()
                                << ": CUDA support not compiled in";
#endif
}

Stream::~Stream() {
#ifdef COHORT_HAVE_CUDA
  // cudaStreamDestroy returns at once; work already enqueued still completes.
  if (native_) cudaStreamDestroy(asStream(native_));
#endif
}

Stream::Stream(Stream&& other) noexcept
    : device_(other.device_), name_(std::move(other.name_)), native_(other.native_) {
  other.native_ = nullptr;
  other.device_ = Device::cpu();
}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Stream old(std::move(*this));  // destroys our old handle on scope exit
    device_ = other.device_;
    name_ = std::move(other.name_);
    native_ = other.native_;
    other.native_ = nullptr;
    other.device_ = Device::cpu();
  }
  return *this;
}

std::string Stream::describe() const { return "stream '" + name_ + "' on " + device_.str(); }

bool Stream::query() const {
#ifdef COHORT_HAVE_CUDA
  if (native_) return readyOrThrow(cudaStreamQuery(asStream(native_)), "cudaStreamQuery");
#endif
  return true;
}

void Stream::synchronize(std::chrono::milliseconds timeout) const {
  if (!native_) return;
  pollUntil([this] { return query(); }, timeout, describe());
}

void Stream::waitEvent(const Event& event) const {
  if (!event.native()) return;  // never recorded on a CUDA stream: already complete
  if (!native_) {
    event.synchronize();  // inline CPU work must not start before the event's GPU work ends
    return;
  }
#ifdef COHORT_HAVE_CUDA
  COHORT_CUDA_CHECK(cudaStreamWaitEvent(asStream(native_), asEvent(event.native()), 0));
#endif
}

// ---- Event ----

Event::Event(EventOptions options) : options_(options) {}

Event::~Event() {
#ifdef COHORT_HAVE_CUDA
  if (native_) cudaEventDestroy(asEvent(native_));
#endif
}

Event::Event(Event&& other) noexcept
    : options_(other.options_),
      device_(other.device_),
      streamName_(std::move(other.streamName_)),
      native_(other.native_),
      recorded_(other.recorded_) {
  other.native_ = nullptr;
  other.recorded_ = false;
  other.device_ = Device::cpu();
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Event old(std::move(*this));
    options_ = other.options_;
    device_ = other.device_;
    streamName_ = std::move(other.streamName_);
    native_ = other.native_;
    recorded_ = other.recorded_;
    other.native_ = nullptr;
    other.recorded_ = false;
    other.device_ = Device::cpu();
  }
  return *this;
}

std::string Event::describe() const {
  if (!recorded_) return "unrecorded event";
  return "event on stream '" + streamName_ + "' on " + device_.str();
}

void Event::record(const Stream& stream) {
  if (stream.device().isCpu()) {
    // Inline CPU work is finished once record() is reached. A CUDA event recorded earlier keeps
    // its mark: a CPU stream cannot move it, and waiting on it stays correct.
    if (!native_) streamName_ = stream.name();
    recorded_ = true;
    return;
  }
#ifdef COHORT_HAVE_CUDA
  if (native_ && device_ != stream.device()) {
    COHORT_THROW(InvalidArgument) << "cannot record " << describe() << " on " << stream.describe()
                                  << ": an event stays on one device";
  }
  if (!native_) {
    cuda::CudaDeviceGuard guard(stream.device().index);
    cudaEvent_t event = nullptr;
    unsigned flags = options_.enableTiming ? cudaEventDefault : cudaEventDisableTiming;
    COHORT_CUDA_CHECK(cudaEventCreateWithFlags(&event, flags));
    native_ = event;
    device_ = stream.device();
  }
  COHORT_CUDA_CHECK(cudaEventRecord(asEvent(native_), asStream(stream.native())));
  streamName_ = stream.name();
  recorded_ = true;
#else
  COHORT_THROW(InvalidArgument) << "cannot record on " << stream.describe()
                                << ": CUDA support not compiled in";
#endif
}

bool Event::query() const {
#ifdef COHORT_HAVE_CUDA
  if (native_) return readyOrThrow(cudaEventQuery(asEvent(native_)), "cudaEventQuery");
#endif
  return true;
}

void Event::synchronize(std::chrono::milliseconds timeout) const {
  if (!native_) return;
  pollUntil([this] { return query(); }, timeout, describe());
}

float Event::elapsedMs(const Event& end) const {
  if (!native_ || !end.native_) {
    COHORT_THROW(InvalidArgument) << "elapsedMs needs two events recorded on CUDA streams ("
                                  << describe() << ", " << end.describe() << ")";
  }
  if (!options_.enableTiming || !end.options_.enableTiming) {
    COHORT_THROW(InvalidArgument) << "elapsedMs needs events created with enableTiming";
  }
  float ms = 0.0f;
#ifdef COHORT_HAVE_CUDA
  COHORT_CUDA_CHECK(cudaEventElapsedTime(&ms, asEvent(native_), asEvent(end.native_)));
#endif
  return ms;
}

}  // namespace cohort::runtime
