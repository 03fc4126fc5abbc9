// A kernel built through cuda_library (third_party/cuda/cuda.bzl), so the rule itself is tested:
// nvcc compiles it, the cc_test links it, and on a GPU it runs.
#include "tests/runtime/cuda/cuda_library_kernels.h"

#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/launch.h"  // COHORT_LAUNCH

namespace cohort::testing {
namespace {

__global__ void addOneKernel(int* data, size_t n) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(blockDim.x) * gridDim.x) {
    data[i] += 1;
  }
}

}  // namespace

int compiledArch() {
#ifdef __CUDA_ARCH__
  return __CUDA_ARCH__;
#else
  return 0;  // host pass
#endif
}

void addOne(int* data, size_t n, const runtime::Stream& stream) {
  runtime::cuda::CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(addOneKernel, 4, 128, 0, static_cast<cudaStream_t>(stream.native()))(data, n);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cohort::testing
