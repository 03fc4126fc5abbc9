#include "runtime/cuda/cuda_check.h"

#include <sstream>

namespace cohort::runtime::cuda {

void throwCudaError(cudaError_t status, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear the non-sticky last error so it is not reported twice
  std::ostringstream os;
  os << "CUDA error " << cudaGetErrorName(status) << " (" << cudaGetErrorString(status) << ") from " << call << " at "
     << file << ":" << line;
  if (status == cudaErrorMemoryAllocation) throw OutOfMemory(os.str());
  throw Error(os.str());
}

CudaDeviceGuard::CudaDeviceGuard(int index) {
  COHORT_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index) COHORT_CUDA_CHECK(cudaSetDevice(index));
}

CudaDeviceGuard::~CudaDeviceGuard() {
  int current = -1;
  // A destructor must not throw; failing to restore the device is ignored deliberately.
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
}

QuietDeviceGuard::QuietDeviceGuard(int index) noexcept {
  switched_ = cudaGetDevice(&previous_) == cudaSuccess && previous_ != index && cudaSetDevice(index) == cudaSuccess;
}

QuietDeviceGuard::~QuietDeviceGuard() {
  if (switched_) cudaSetDevice(previous_);
}

}  // namespace cohort::runtime::cuda
