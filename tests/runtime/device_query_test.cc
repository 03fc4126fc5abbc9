// hostInfo() sanity and formatDevices() text. Runs everywhere; the CUDA device list itself is
// checked by tests/runtime/cuda/device_query_gpu_test.cc.
#include "runtime/device_query.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "runtime/device.h"

namespace cohort::runtime {
namespace {

TEST(HostInfo, ReportsThisMachine) {
  HostInfo host = hostInfo();
  EXPECT_FALSE(host.hostname.empty());
  EXPECT_FALSE(host.cpuModel.empty());
  EXPECT_EQ(host.logicalCores, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  EXPECT_GT(host.totalMemoryBytes, size_t{64} << 20);
  EXPECT_GT(host.availableMemoryBytes, 0u);
  EXPECT_LE(host.availableMemoryBytes, host.totalMemoryBytes);
}

TEST(FormatBytes, UsesBinaryUnits) {
  EXPECT_EQ(formatBytes(0), "0 B");
  EXPECT_EQ(formatBytes(512), "512 B");
  EXPECT_EQ(formatBytes(1536), "1.5 KiB");
  EXPECT_EQ(formatBytes(size_t{3} << 30), "3.0 GiB");
}

TEST(CudaDevices, EmptyListComesWithAReason) {
  std::string why;
  std::vector<CudaDeviceInfo> devices = cudaDevices(&why);
  if (!cudaCompiled()) {
    EXPECT_TRUE(devices.empty());
    EXPECT_EQ(why, "CUDA support not compiled in");
  }
  if (devices.empty()) {
    EXPECT_FALSE(why.empty());
    std::string text = formatDevices(hostInfo(), devices, why);
    EXPECT_NE(text.find("CUDA devices: 0"), std::string::npos) << text;
    EXPECT_NE(text.find(cudaCompiled() ? "no CUDA device" : "CUDA support not compiled in"),
              std::string::npos)
        << text;
  } else {
    EXPECT_TRUE(why.empty()) << why;
  }
  EXPECT_NO_THROW(cudaDevices(nullptr));
}

TEST(FormatDevices, NoDeviceSaysWhy) {
  HostInfo host;
  host.hostname = "node1";
  host.cpuModel = "Test CPU";
  host.logicalCores = 8;
  host.totalMemoryBytes = size_t{16} << 30;
  host.availableMemoryBytes = size_t{12} << 30;
  std::string text = formatDevices(host, {}, "no CUDA device (CUDA driver not found)");
  EXPECT_EQ(text,
            "Host: node1, Test CPU, 8 logical cores, 16.0 GiB memory (12.0 GiB available)\n"
            "CUDA devices: 0 (no CUDA device (CUDA driver not found))\n");
}

TEST(FormatDevices, ListsEveryDevice) {
  CudaDeviceInfo d;
  d.index = 0;
  d.name = "NVIDIA H200";
  d.pciBusId = "0000:19:00.0";
  d.computeCapabilityMajor = 9;
  d.computeCapabilityMinor = 0;
  d.totalMemoryBytes = size_t{140} << 30;
  d.freeMemoryBytes = size_t{139} << 30;
  d.multiprocessorCount = 132;
  d.clockRateKhz = 1980000;
  d.memoryClockRateKhz = 2619000;
  d.memoryBusWidthBits = 5120;
  d.l2CacheBytes = 60 << 20;
  d.maxThreadsPerBlock = 1024;
  d.sharedMemoryPerBlockBytes = 48 << 10;
  d.eccEnabled = true;
  d.driverVersion = 13000;
  d.runtimeVersion = 13000;
  CudaDeviceInfo d1 = d;
  d1.index = 1;
  std::string text = formatDevices(hostInfo(), {d, d1}, "");
  EXPECT_NE(text.find("CUDA devices: 2 (driver 13.0, runtime 13.0)"), std::string::npos) << text;
  EXPECT_NE(text.find("cuda:0  NVIDIA H200  compute 9.0  132 SMs  140.0 GiB total, 139.0 GiB free"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("cuda:1  NVIDIA H200"), std::string::npos) << text;
  EXPECT_NE(
      text.find("clock 1980 MHz, memory 2619 MHz x 5120-bit, L2 60.0 MiB, 1024 threads/block, "
                "48.0 KiB shared/block, ECC on, PCI 0000:19:00.0"),
      std::string::npos)
      << text;
}

}  // namespace
}  // namespace cohort::runtime
