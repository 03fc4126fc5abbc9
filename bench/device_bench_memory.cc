#include "bench/device_bench_memory.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/gpu_context.h"
#include "runtime/error.h"
#include "runtime/stream.h"

namespace cohort::bench {
namespace {

// cudaMalloc'ed floats, zeroed, freed on destruction (`--buffers user`).
class DeviceFloats {
 public:
  DeviceFloats(size_t count, const runtime::Stream& stream, std::chrono::milliseconds timeout)
      : device_(stream.device().index) {
    runtime::cuda::CudaDeviceGuard guard(device_);
    const size_t bytes = std::max<size_t>(256, count * sizeof(float));
    void* p = nullptr;
    COHORT_CUDA_CHECK(cudaMalloc(&p, bytes));
    data_ = static_cast<float*>(p);
    // cudaMemset would return before it is done, on the legacy stream that our non-blocking streams
    // do not wait for: zero on a stream and wait for it instead.
    try {
      COHORT_CUDA_CHECK(cudaMemsetAsync(data_, 0, bytes, static_cast<cudaStream_t>(stream.native())));
      stream.synchronize(timeout);
    } catch (...) {
      cudaFree(data_);
      throw;
    }
  }
  ~DeviceFloats() {
    runtime::cuda::QuietDeviceGuard guard(device_);
    cudaFree(data_);
  }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* data() const { return data_; }

 private:
  int device_;
  float* data_ = nullptr;
};

class CudaBenchMemory final : public DeviceBenchMemory {
 public:
  CudaBenchMemory(collectives::Communicator& comm, const DeviceBenchMemoryOptions& o)
      : timeout_(o.timeout), copies_(runtime::Device::cuda(o.device), {.name = "bench copies"}) {
    if (o.fromCommunicator) {
      sharedOutput_ = comm.allocateBuffer(o.maxCount);
      if (!o.inPlace) sharedInput_ = comm.allocateBuffer(o.maxCount);
      sharedScratch_ = comm.allocateBuffer(o.scratchCount);
      output_ = sharedOutput_->data();
      input_ = o.inPlace ? output_ : sharedInput_->data();
      scratch_ = sharedScratch_->data();
    } else {
      userOutput_ = std::make_unique<DeviceFloats>(o.maxCount, copies_, timeout_);
      if (!o.inPlace) userInput_ = std::make_unique<DeviceFloats>(o.maxCount, copies_, timeout_);
      userScratch_ = std::make_unique<DeviceFloats>(o.scratchCount, copies_, timeout_);
      output_ = userOutput_->data();
      input_ = o.inPlace ? output_ : userInput_->data();
      scratch_ = userScratch_->data();
    }
  }

  float* input() override { return input_; }
  float* output() override { return output_; }
  float* scratch() override { return scratch_; }

  void upload(float* device, const float* host, size_t count) override {
    if (count == 0) return;
    runtime::cuda::copyToDevice(device, host, count * sizeof(float), copies_);
    copies_.synchronize(timeout_);
  }
  void download(float* host, const float* device, size_t count) override {
    if (count == 0) return;
    runtime::cuda::copyToHost(host, device, count * sizeof(float), copies_);
    copies_.synchronize(timeout_);
  }

 private:
  std::chrono::milliseconds timeout_;
  runtime::Stream copies_;
  collectives::BufferPtr sharedOutput_, sharedInput_, sharedScratch_;
  std::unique_ptr<DeviceFloats> userOutput_, userInput_, userScratch_;
  float* input_ = nullptr;
  float* output_ = nullptr;
  float* scratch_ = nullptr;
};

}  // namespace

std::unique_ptr<DeviceBenchMemory> makeDeviceBenchMemory(collectives::Communicator& comm,
                                                         const DeviceBenchMemoryOptions& options) {
  return std::make_unique<CudaBenchMemory>(comm, options);
}

}  // namespace cohort::bench
