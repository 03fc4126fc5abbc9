#include "ipc/cuda_device_memory.h"

#include <cuda_runtime.h>

#include <cstring>

#include "runtime/cuda/cuda_check.h"
#include "runtime/error.h"

namespace cohort::ipc {

using runtime::cuda::CudaDeviceGuard;

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes, "IpcHandle must hold a cudaIpcMemHandle_t");

CudaDeviceMemory::CudaDeviceMemory(runtime::Device device) : device_(device) {
  if (!device.isCuda()) COHORT_THROW(InvalidArgument) << "CudaDeviceMemory needs a CUDA device, got " << device.str();
}

std::string CudaDeviceMemory::deviceId() const {
  char bus[32] = {};
  COHORT_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), device_.index));
  return bus;
}

void* CudaDeviceMemory::allocate(size_t bytes) {
  CudaDeviceGuard guard(device_.index);
  void* p = nullptr;
  COHORT_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void CudaDeviceMemory::release(void* ptr) noexcept {
  runtime::cuda::QuietDeviceGuard guard(device_.index);
  cudaFree(ptr);
}

IpcHandle CudaDeviceMemory::exportHandle(void* ptr) {
  CudaDeviceGuard guard(device_.index);
  cudaIpcMemHandle_t handle;
  COHORT_CUDA_CHECK(cudaIpcGetMemHandle(&handle, ptr));
  IpcHandle out;
  std::memcpy(out.data(), &handle, out.size());
  return out;
}

bool CudaDeviceMemory::canAccess(const std::string& deviceId) const {
  int other = -1;
  // Not visible to this process (CUDA_VISIBLE_DEVICES): not reachable either.
  if (cudaDeviceGetByPCIBusId(&other, deviceId.c_str()) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (other == device_.index) return true;
  int can = 0;
  COHORT_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device_.index, other));
  return can != 0;
}

void* CudaDeviceMemory::open(const IpcHandle& handle) {
  CudaDeviceGuard guard(device_.index);
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), handle.size());
  void* p = nullptr;
  COHORT_CUDA_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  return p;
}

void CudaDeviceMemory::close(void* ptr) noexcept {
  runtime::cuda::QuietDeviceGuard guard(device_.index);
  cudaIpcCloseMemHandle(ptr);
}

}  // namespace cohort::ipc
