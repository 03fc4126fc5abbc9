// CudaDeviceMemory: DeviceShare's device calls (ipc/device_share.h) on one GPU with the CUDA runtime:
// cudaMalloc / cudaFree for the owner's dedicated allocation, cudaIpcGetMemHandle to export it,
// cudaIpcOpenMemHandle (with lazy peer access, so a worker on another GPU with peer access can open
// it) and cudaIpcCloseMemHandle for importers, the PCI bus id as the GPU's node-wide identity, and
// cudaDeviceCanAccessPeer for the reachability check.
// Every call makes the device current for its duration (CudaDeviceGuard). Errors throw as
// COHORT_CUDA_CHECK does (OutOfMemory for a failed cudaMalloc); release and close ignore errors.
// Only built when CUDA is compiled in. Thread safety: stateless beyond the device; any thread.
#pragma once

#include "ipc/device_share.h"
#include "runtime/device.h"

namespace cohort::ipc {

class CudaDeviceMemory final : public DeviceMemory {
 public:
  // Throws InvalidArgument for a non-CUDA device.
  explicit CudaDeviceMemory(runtime::Device device);

  std::string deviceId() const override;
  void* allocate(size_t bytes) override;
  void release(void* ptr) noexcept override;
  IpcHandle exportHandle(void* ptr) override;
  bool canAccess(const std::string& deviceId) const override;
  void* open(const IpcHandle& handle) override;
  void close(void* ptr) noexcept override;

 private:
  runtime::Device device_;
};

}  // namespace cohort::ipc
