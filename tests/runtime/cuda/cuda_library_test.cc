// The cuda_library rule end to end: the .cu file below it is compiled by nvcc, linked into this
// test, and its kernel runs on the GPU (tags = ["gpu"]; skips without a device).
#include <gtest/gtest.h>

#include <vector>

#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/stream.h"
#include "tests/runtime/cuda/cuda_library_kernels.h"

namespace cohort::testing {
namespace {

TEST(CudaLibrary, LinksNvccCompiledCode) { EXPECT_EQ(compiledArch(), 0); }

TEST(CudaLibrary, KernelRuns) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  runtime::Stream stream(runtime::Device::cuda(0), {.name = "test"});
  const size_t n = 1000;
  int* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, n * sizeof(int)), cudaSuccess);
  std::vector<int> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<int>(i);
  ASSERT_EQ(cudaMemcpy(device, host.data(), n * sizeof(int), cudaMemcpyHostToDevice), cudaSuccess);
  addOne(device, n, stream);
  addOne(device, n, stream);
  stream.synchronize(std::chrono::seconds(30));
  ASSERT_EQ(cudaMemcpy(host.data(), device, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(device);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(host[i], static_cast<int>(i) + 2) << "at " << i;
}

}  // namespace
}  // namespace cohort::testing

#else  // !COHORT_HAVE_CUDA

TEST(CudaLibrary, NeedsCuda) { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }

#endif
