// cudaDevices() on a machine with a GPU (tags = ["gpu"]): every field is filled in and sane.
#include <gtest/gtest.h>

#include <string>

#include "runtime/device_query.h"
#include "tests/runtime/cuda/gpu_test_util.h"

namespace cohort::runtime {
namespace {

TEST(CudaDevicesGpu, DescribesEveryDevice) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  std::string why = "unchanged";
  std::vector<CudaDeviceInfo> devices = cudaDevices(&why);
  ASSERT_FALSE(devices.empty());
  EXPECT_TRUE(why.empty()) << why;
  for (size_t i = 0; i < devices.size(); ++i) {
    const CudaDeviceInfo& d = devices[i];
    SCOPED_TRACE("cuda:" + std::to_string(i) + " " + d.name);
    EXPECT_EQ(d.index, static_cast<int>(i));
    EXPECT_FALSE(d.name.empty());
    EXPECT_FALSE(d.pciBusId.empty());
    EXPECT_GE(d.computeCapabilityMajor, 8) << "Cohort's kernels are built for sm_80 and newer";
    EXPECT_GT(d.totalMemoryBytes, size_t{1} << 30);
    EXPECT_GT(d.freeMemoryBytes, 0u);
    EXPECT_LE(d.freeMemoryBytes, d.totalMemoryBytes);
    EXPECT_GT(d.multiprocessorCount, 0);
    EXPECT_GT(d.clockRateKhz, 0);
    EXPECT_GT(d.memoryClockRateKhz, 0);
    EXPECT_GT(d.memoryBusWidthBits, 0);
    EXPECT_GT(d.l2CacheBytes, 0);
    EXPECT_GE(d.maxThreadsPerBlock, 256);
    EXPECT_GT(d.sharedMemoryPerBlockBytes, 0u);
    EXPECT_GT(d.driverVersion, 0);
    EXPECT_GT(d.runtimeVersion, 0);
  }
  std::string text = formatDevices(hostInfo(), devices, why);
  EXPECT_NE(text.find("CUDA devices: " + std::to_string(devices.size())), std::string::npos);
  EXPECT_NE(text.find(devices[0].name), std::string::npos) << text;
  std::printf("%s", text.c_str());  // visible in the test log: what the GPU machine has
}

}  // namespace
}  // namespace cohort::runtime
