#include "runtime/device_query.h"

#include <sys/sysinfo.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"
#endif

namespace cohort::runtime {
namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// The value after "key:" on the first line of `path` that starts with `key`, or "".
std::string procField(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) != 0) continue;
    size_t colon = line.find(':');
    if (colon != std::string::npos && trim(line.substr(key.size(), colon - key.size())).empty()) {
      return trim(line.substr(colon + 1));
    }
  }
  return "";
}

// "/proc/meminfo"'s "MemTotal:  16318056 kB" -> bytes; 0 when missing.
size_t meminfoBytes(const std::string& key) {
  std::string v = procField("/proc/meminfo", key);
  if (v.empty()) return 0;
  return static_cast<size_t>(std::strtoull(v.c_str(), nullptr, 10)) * 1024;
}

std::string versionText(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

#ifdef COHORT_HAVE_CUDA
int attribute(cudaDeviceAttr attr, int device) {
  int value = 0;
  COHORT_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  return value;
}

CudaDeviceInfo queryDevice(int index, int driverVersion, int runtimeVersion) {
  cudaDeviceProp prop{};
  COHORT_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  CudaDeviceInfo info;
  info.index = index;
  info.name = prop.name;
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), index) == cudaSuccess) info.pciBusId = bus;
  cudaGetLastError();
  info.computeCapabilityMajor = prop.major;
  info.computeCapabilityMinor = prop.minor;
  info.totalMemoryBytes = prop.totalGlobalMem;
  info.multiprocessorCount = prop.multiProcessorCount;
  // CUDA 13 dropped the clock fields from cudaDeviceProp; the attributes remain.
  info.clockRateKhz = attribute(cudaDevAttrClockRate, index);
  info.memoryClockRateKhz = attribute(cudaDevAttrMemoryClockRate, index);
  info.memoryBusWidthBits = prop.memoryBusWidth;
  info.l2CacheBytes = prop.l2CacheSize;
  info.maxThreadsPerBlock = prop.maxThreadsPerBlock;
  info.sharedMemoryPerBlockBytes = prop.sharedMemPerBlock;
  info.eccEnabled = prop.ECCEnabled != 0;
  info.driverVersion = driverVersion;
  info.runtimeVersion = runtimeVersion;
  cuda::CudaDeviceGuard guard(index);
  size_t freeBytes = 0, totalBytes = 0;
  if (cudaMemGetInfo(&freeBytes, &totalBytes) == cudaSuccess) info.freeMemoryBytes = freeBytes;
  cudaGetLastError();
  return info;
}
#endif

}  // namespace

std::string CudaDeviceInfo::computeCapability() const {
  return std::to_string(computeCapabilityMajor) + "." + std::to_string(computeCapabilityMinor);
}

HostInfo hostInfo() {
  HostInfo info;
  char name[256] = {};
  info.hostname = gethostname(name, sizeof(name) - 1) == 0 ? name : "unknown";
  info.cpuModel = procField("/proc/cpuinfo", "model name");
  if (info.cpuModel.empty()) info.cpuModel = "unknown";
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  info.logicalCores = cores > 0 ? static_cast<int>(cores) : 1;
  info.totalMemoryBytes = meminfoBytes("MemTotal");
  info.availableMemoryBytes = meminfoBytes("MemAvailable");
  struct sysinfo si {};
  if ((info.totalMemoryBytes == 0 || info.availableMemoryBytes == 0) && sysinfo(&si) == 0) {
    if (info.totalMemoryBytes == 0) info.totalMemoryBytes = size_t{si.totalram} * si.mem_unit;
    if (info.availableMemoryBytes == 0) {
      info.availableMemoryBytes = size_t{si.freeram + si.bufferram} * si.mem_unit;
    }
  }
  return info;
}

std::vector<CudaDeviceInfo> cudaDevices(std::string* whyNone) {
  std::string unused;
  std::string& why = whyNone ? *whyNone : unused;
  why.clear();
#ifndef COHORT_HAVE_CUDA
  why = "CUDA support not compiled in";
  return {};
#else
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    std::string detail = cudaGetErrorString(status);
    if (status == cudaErrorInsufficientDriver) {
      why = "no CUDA device (CUDA driver not found or too old: " + detail + ")";
    } else if (status == cudaErrorNoDevice) {
      why = "no CUDA device (" + detail + ")";
    } else {
      why = "no CUDA device (" + std::string(cudaGetErrorName(status)) + ": " + detail + ")";
    }
    return {};
  }
  if (count == 0) {
    why = "no CUDA device (the driver reports 0 devices)";
    return {};
  }
  int driverVersion = 0, runtimeVersion = 0;
  cudaDriverGetVersion(&driverVersion);
  cudaRuntimeGetVersion(&runtimeVersion);
  std::vector<CudaDeviceInfo> devices;
  for (int i = 0; i < count; ++i) devices.push_back(queryDevice(i, driverVersion, runtimeVersion));
  for (int i = 0; i < count; ++i) {
    devices[static_cast<size_t>(i)].canAccessPeer.assign(static_cast<size_t>(count), false);
    for (int j = 0; j < count; ++j) {
      int can = 0;
      if (i != j && cudaDeviceCanAccessPeer(&can, i, j) == cudaSuccess) {
        devices[static_cast<size_t>(i)].canAccessPeer[static_cast<size_t>(j)] = can != 0;
      }
      cudaGetLastError();
    }
  }
  return devices;
#endif
}

std::optional<CudaMemory> cudaMemory(int index) {
#ifdef COHORT_HAVE_CUDA
  cudaDeviceProp prop{};
  size_t freeBytes = 0, totalBytes = 0;
  bool known = cudaGetDeviceProperties(&prop, index) == cudaSuccess;
  if (known) {
    cuda::CudaDeviceGuard guard(index);
    known = cudaMemGetInfo(&freeBytes, &totalBytes) == cudaSuccess;
  }
  cudaGetLastError();
  if (known) {
    return CudaMemory{
        .name = prop.name, .freeBytes = freeBytes, .totalBytes = totalBytes, .computeCapabilityMajor = prop.major};
  }
#endif
  (void)index;
  return std::nullopt;
}

std::string formatBytes(size_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 5) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof(buf), "%zu B", bytes);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f %s", v, kUnits[unit]);
  }
  return buf;
}

std::string formatDevices(const HostInfo& host, const std::vector<CudaDeviceInfo>& devices,
                          const std::string& whyNone) {
  std::ostringstream os;
  os << "Host: " << host.hostname << ", " << host.cpuModel << ", " << host.logicalCores
     << " logical cores, " << formatBytes(host.totalMemoryBytes) << " memory ("
     << formatBytes(host.availableMemoryBytes) << " available)\n";
  if (devices.empty()) {
    os << "CUDA devices: 0 (" << (whyNone.empty() ? "no CUDA device" : whyNone) << ")\n";
    return os.str();
  }
  os << "CUDA devices: " << devices.size() << " (driver " << versionText(devices[0].driverVersion)
     << ", runtime " << versionText(devices[0].runtimeVersion) << ")\n";
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) os << "  CUDA_VISIBLE_DEVICES=" << visible << "\n";
  for (const CudaDeviceInfo& d : devices) {
    os << "  cuda:" << d.index << "  " << d.name << "  compute " << d.computeCapability() << "  "
       << d.multiprocessorCount << " SMs  " << formatBytes(d.totalMemoryBytes) << " total, "
       << formatBytes(d.freeMemoryBytes) << " free\n";
    os << "          clock " << d.clockRateKhz / 1000 << " MHz, memory "
       << d.memoryClockRateKhz / 1000 << " MHz x " << d.memoryBusWidthBits << "-bit, L2 "
       << formatBytes(static_cast<size_t>(d.l2CacheBytes)) << ", " << d.maxThreadsPerBlock
       << " threads/block, " << formatBytes(d.sharedMemoryPerBlockBytes) << " shared/block, ECC "
       << (d.eccEnabled ? "on" : "off") << ", PCI " << (d.pciBusId.empty() ? "?" : d.pciBusId)
       << "\n";
  }
  if (devices.size() > 1) {
    os << "  peer access (row can access column):\n          ";
    for (const CudaDeviceInfo& d : devices) os << " cuda:" << d.index;
    os << "\n";
    for (const CudaDeviceInfo& d : devices) {
      os << "  cuda:" << d.index << "  ";
      for (size_t j = 0; j < devices.size(); ++j) {
        const char* cell = j == static_cast<size_t>(d.index) ? "-" : (j < d.canAccessPeer.size() && d.canAccessPeer[j] ? "yes" : "no");
        os << " " << std::string(6 - std::char_traits<char>::length(cell), ' ') << cell;
      }
      os << "\n";
    }
  }
  return os.str();
}

Device selectDevice(const std::string& spec, int localRank) {
  const Device requested = Device::parse(spec);
  if (requested.isCpu()) return requested;
  std::string why;
  std::vector<CudaDeviceInfo> gpus = cudaDevices(&why);
  if (gpus.empty()) COHORT_THROW(InvalidArgument) << "--device " << spec << ": " << why;
  const bool explicitIndex = spec.find(':') != std::string::npos;
  const int index = explicitIndex ? requested.index : localRank;
  if (index < 0 || index >= static_cast<int>(gpus.size())) {
    COHORT_THROW(InvalidArgument) << "--device " << spec << ": "
                                  << (explicitIndex ? "cuda:" + std::to_string(index) + " requested"
                                                    : "local rank " + std::to_string(localRank) + " needs cuda:" + std::to_string(index))
                                  << " but " << gpus.size() << " CUDA device(s) are visible"
                                  << (std::getenv("CUDA_VISIBLE_DEVICES") ? " (CUDA_VISIBLE_DEVICES is set)" : "");
  }
  return Device::cuda(index);
}

}  // namespace cohort::runtime
