// Device query: what this machine has — the host's CPU and memory, and the CUDA devices the driver
// can see — and the text `cohort devices` prints about it.
//
// hostInfo() reads /proc/cpuinfo, sysconf and /proc/meminfo (sysinfo as a fallback); it never
// throws. cudaDevices() asks the CUDA runtime. When CUDA is not compiled in, or there is no driver
// or no device, it returns an empty list and, if `whyNone` is given, a plain reason ("CUDA support
// not compiled in", "no CUDA device (CUDA driver not found or too old: ...)"). Other CUDA failures
// throw cohort::Error. Querying creates no CUDA context except for cudaMemGetInfo's free-memory
// figure, which initialises a context on each device (do it before forking, or in a process that
// will use CUDA anyway).
// All results are plain values. Thread safety: safe to call from any thread.
//
//   std::string why;
//   auto gpus = cudaDevices(&why);
//   std::cout << formatDevices(hostInfo(), gpus, why);
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "runtime/device.h"

namespace cohort::runtime {

struct HostInfo {
  std::string hostname;
  std::string cpuModel;  // "model name" of the first processor, or "unknown"
  int logicalCores = 0;  // online logical CPUs
  size_t totalMemoryBytes = 0;
  size_t availableMemoryBytes = 0;  // MemAvailable: what can be allocated without swapping
};

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  std::string pciBusId;  // "0000:3B:00.0"
  int computeCapabilityMajor = 0;
  int computeCapabilityMinor = 0;
  size_t totalMemoryBytes = 0;
  size_t freeMemoryBytes = 0;
  int multiprocessorCount = 0;
  int clockRateKhz = 0;
  int memoryClockRateKhz = 0;
  int memoryBusWidthBits = 0;
  int l2CacheBytes = 0;
  int maxThreadsPerBlock = 0;
  size_t sharedMemoryPerBlockBytes = 0;
  bool eccEnabled = false;
  int driverVersion = 0;   // e.g. 13000 for 13.0
  int runtimeVersion = 0;  // the CUDA runtime Cohort was built against
  // canAccessPeer[j]: this device can read and write device j's memory directly (cudaDeviceCanAccessPeer;
  // false for itself).
  std::vector<bool> canAccessPeer;

  // "9.0"
  std::string computeCapability() const;
};

HostInfo hostInfo();

// Every CUDA device, in CUDA's order; empty with a reason in *whyNone (when non-null) if none.
std::vector<CudaDeviceInfo> cudaDevices(std::string* whyNone = nullptr);

// One CUDA device's memory as the runtime reports it now (cudaMemGetInfo on that device only: what
// is free beside every context's memory, this process's included; the emulated device reports
// COHORT_CUDASIM_MEMORY_MB less what this process holds). nullopt when CUDA is not compiled in or
// the runtime cannot say.
struct CudaMemory {
  std::string name;  // the device's ("NVIDIA H200")
  size_t freeBytes = 0;
  size_t totalBytes = 0;
  int computeCapabilityMajor = 0;  // 9 for 9.0 (cuBLASLt's workspace depends on it: runtime/gpu_scratch.h)
};
std::optional<CudaMemory> cudaMemory(int index);

// The human-readable report, e.g.
//   Host: node17, AMD EPYC 9654 96-Core Processor, 192 logical cores, 1.5 TiB memory (1.4 TiB
//   available) CUDA devices: 1 (driver 13.0, runtime 13.0)
//     cuda:0  NVIDIA H200  compute 9.0  132 SMs  139.8 GiB total, 139.2 GiB free
//             clock 1980 MHz, memory 2619 MHz x 5120-bit, L2 60.0 MiB, 1024 threads/block,
//             48.0 KiB shared/block, ECC on, PCI 0000:19:00.0
//   peer access (row can access column):  ... a matrix of yes/no when there are two or more devices
//   CUDA_VISIBLE_DEVICES=... when it is set, since it decides what is listed
// or, without devices, "CUDA devices: 0 (no CUDA device (...))" with the reason.
std::string formatDevices(const HostInfo& host, const std::vector<CudaDeviceInfo>& devices,
                          const std::string& whyNone);

// The device `cohort train --device SPEC` runs on: "cpu"; "cuda" = the GPU of this worker's local
// rank (one worker per GPU under cohortrun, mpirun or srun); "cuda:N" = GPU N (numbered as
// CUDA_VISIBLE_DEVICES leaves them). Throws InvalidArgument with one line saying why when the spec is
// malformed, CUDA is not compiled in, there is no usable device (no driver, a driver older than the
// runtime, none visible), or the index is out of range.
Device selectDevice(const std::string& spec, int localRank);

// "1.5 GiB", "512 B": binary units with one decimal.
std::string formatBytes(size_t bytes);

}  // namespace cohort::runtime
