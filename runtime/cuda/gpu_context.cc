#include "runtime/cuda/gpu_context.h"

#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/gemm_tuner.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {
namespace {

Device checkedCuda(Device device) {
  if (!device.isCuda()) COHORT_THROW(InvalidArgument) << "GpuContext needs a CUDA device, got " << device.str();
  return device;
}

void copyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const Stream& stream) {
  COHORT_CHECK(stream.device().isCuda()) << "a device copy needs a CUDA stream, got " << stream.describe();
  if (bytes == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  COHORT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, static_cast<cudaStream_t>(stream.native())));
}

}  // namespace

GpuContext::GpuContext(Device device, const GpuOptions& options)
    : device_(checkedCuda(device)),
      options_(options),
      stream_(device, StreamOptions{.name = "compute"}),
      allocator_(device),
      tuneGemms_(options.tuneGemms ? *options.tuneGemms : gemmTuningFromEnvironment(true)),
      blas_(stream_, {.allocator = &allocator_, .tuneGemms = tuneGemms_, .timer = nullptr}),
      workspace_(allocator_) {
  if (options.tf32) blas_.setTf32(true);
}

void copyToDevice(void* dst, const void* src, size_t bytes, const Stream& stream) {
  copyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream);
}

void copyToHost(void* dst, const void* src, size_t bytes, const Stream& stream) {
  copyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream);
}

void copyOnDevice(void* dst, const void* src, size_t bytes, const Stream& stream) {
  copyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
}

}  // namespace cohort::runtime::cuda
