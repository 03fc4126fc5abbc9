// COHORT_CUDA_CHECK and CudaDeviceGuard: the two things every CUDA call site in Cohort needs.
//
// COHORT_CUDA_CHECK(expr) evaluates a CUDA runtime call once. On failure it throws
//   cudaErrorMemoryAllocation -> cohort::OutOfMemory (exit code 5)
//   anything else             -> cohort::Error (exit code 1)
// with the call's text, the CUDA error name and string, and file:line. The CUDA runtime's "last
// error" is cleared first, so the next check does not report a stale error again.
// CudaDeviceGuard makes `index` the calling thread's current device for its lifetime and restores
// the previous one, so library code never leaves the caller on another device.
// Only built when CUDA is compiled in (COHORT_HAVE_CUDA); include from CUDA code only.
// Thread safety: both are per-thread (the CUDA current device is thread-local state).
//
//   CudaDeviceGuard guard(device.index);
//   COHORT_CUDA_CHECK(cudaMalloc(&ptr, bytes));
#pragma once

#include <cuda_runtime.h>

#include "runtime/error.h"

namespace cohort::runtime::cuda {

// Throws the exception COHORT_CUDA_CHECK describes. Never returns.
[[noreturn]] void throwCudaError(cudaError_t status, const char* call, const char* file, int line);

class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int index);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// CudaDeviceGuard for destructors and other noexcept paths: makes `index` current if it can and
// restores the previous device, ignoring every failure.
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int index) noexcept;
  ~QuietDeviceGuard();
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
};

}  // namespace cohort::runtime::cuda

#define COHORT_CUDA_CHECK(expr)                                                                \
  do {                                                                                         \
    cudaError_t cohort_cuda_status_ = (expr);                                                  \
    if (__builtin_expect(cohort_cuda_status_ != cudaSuccess, 0)) {                             \
      ::cohort::runtime::cuda::throwCudaError(cohort_cuda_status_, #expr, __FILE__, __LINE__); \
    }                                                                                          \
  } while (0)
