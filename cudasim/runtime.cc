// The CUDA runtime as cudasim emulates it (include/cuda_runtime.h, include/cudasim/sim.h): the
// configuration, the registry of what is live, devices and their properties, the calling thread's
// device and last error, and CUDA's error names. Devices are numbers with properties. Memory is
// memory.cc's, streams and events are streams.cc's (runtime.h says what they share).
#include <pthread.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cudasim/capture.h"
#include "cudasim/runtime.h"
#include "cudasim/sim.h"

namespace cudasim {
namespace {

long envNumber(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0) {
    std::fprintf(stderr, "cudasim: %s=%s is not a non-negative number\n", name, v);
    std::exit(2);
  }
  return n;
}

Registry* gRegistry = nullptr;

// A forked child starts with a fresh device state, as a new process would: the parent's streams have
// no threads there, and another thread may have held the registry's lock at the fork.
void resetAfterFork() {
  gRegistry = new Registry;  // the parent's copy is left as it was (its lock may be held)
  tlsDevice = 0;
  tlsLastError = cudaSuccess;
}

}  // namespace

const Config& config() {
  static const Config c = [] {
    Config c;
    c.devices = static_cast<int>(std::min<long>(envNumber("COHORT_CUDASIM_DEVICES", 2), kMaxDevices));
    c.memoryBytes = static_cast<size_t>(envNumber("COHORT_CUDASIM_MEMORY_MB", 2048)) << 20;
    c.peer = envNumber("COHORT_CUDASIM_PEER", 1) != 0;
    c.delayUs = static_cast<unsigned>(envNumber("COHORT_CUDASIM_DELAY_US", 200));
    c.seed = static_cast<uint64_t>(envNumber("COHORT_CUDASIM_SEED", static_cast<long>(::getpid())));
    // CUDA_VISIBLE_DEVICES as the real runtime reads it: a list of indices, cut at the first
    // invalid or repeated one.
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
      std::string list = v;
      size_t at = 0;
      while (at <= list.size()) {
        size_t comma = list.find(',', at);
        std::string item = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        char* end = nullptr;
        long n = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || n < 0 || n >= c.devices ||
            std::find(c.visible.begin(), c.visible.end(), n) != c.visible.end()) {
          break;
        }
        c.visible.push_back(static_cast<int>(n));
        if (comma == std::string::npos) break;
        at = comma + 1;
      }
    } else {
      for (int d = 0; d < c.devices; ++d) c.visible.push_back(d);
    }
    return c;
  }();
  return c;
}

int deviceCount() { return static_cast<int>(config().visible.size()); }

thread_local cudaError_t tlsLastError = cudaSuccess;
thread_local int tlsDevice = 0;

cudaError_t fail(cudaError_t e) {
  tlsLastError = e;
  return e;
}

Registry& registry() {
  static const bool once = [] {
    gRegistry = new Registry;  // never destroyed: stream threads may outlive static destruction
    pthread_atfork(nullptr, nullptr, resetAfterFork);
    return true;
  }();
  (void)once;
  return *gRegistry;
}

uint64_t nextSeed() {
  static std::atomic<uint64_t> counter{0};
  uint64_t z = config().seed + 0x9e3779b97f4a7c15ull * (counter.fetch_add(1) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

cudaStream_t resolveStream(cudaStream_t stream) { return resolve(stream); }
int streamDevice(cudaStream_t stream) { return stream->device; }
int currentDevice() { return tlsDevice; }
cudaError_t failWith(cudaError_t error) { return fail(error); }

}  // namespace cudasim

using namespace cudasim;

extern "C" {

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
#define COHORT_CUDASIM_NAME(e) \
  case e:                      \
    return #e;
    COHORT_CUDASIM_NAME(cudaSuccess)
    COHORT_CUDASIM_NAME(cudaErrorInvalidValue)
    COHORT_CUDASIM_NAME(cudaErrorMemoryAllocation)
    COHORT_CUDASIM_NAME(cudaErrorInitializationError)
    COHORT_CUDASIM_NAME(cudaErrorInvalidConfiguration)
    COHORT_CUDASIM_NAME(cudaErrorInvalidMemcpyDirection)
    COHORT_CUDASIM_NAME(cudaErrorInsufficientDriver)
    COHORT_CUDASIM_NAME(cudaErrorNoDevice)
    COHORT_CUDASIM_NAME(cudaErrorInvalidDevice)
    COHORT_CUDASIM_NAME(cudaErrorInvalidContext)
    COHORT_CUDASIM_NAME(cudaErrorMapBufferObjectFailed)
    COHORT_CUDASIM_NAME(cudaErrorPeerAccessUnsupported)
    COHORT_CUDASIM_NAME(cudaErrorInvalidResourceHandle)
    COHORT_CUDASIM_NAME(cudaErrorNotReady)
    COHORT_CUDASIM_NAME(cudaErrorIllegalAddress)
    COHORT_CUDASIM_NAME(cudaErrorLaunchFailure)
    COHORT_CUDASIM_NAME(cudaErrorIllegalState)
    COHORT_CUDASIM_NAME(cudaErrorStreamCaptureUnsupported)
    COHORT_CUDASIM_NAME(cudaErrorStreamCaptureInvalidated)
    COHORT_CUDASIM_NAME(cudaErrorStreamCaptureIsolation)
    COHORT_CUDASIM_NAME(cudaErrorCapturedEvent)
    COHORT_CUDASIM_NAME(cudaErrorStreamCaptureWrongThread)
#undef COHORT_CUDASIM_NAME
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidContext:
      return "invalid device context";
    case cudaErrorMapBufferObjectFailed:
      return "mapping of buffer object failed";
    case cudaErrorPeerAccessUnsupported:
      return "peer access is not supported between these two devices";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    default:
      return cudaGetErrorName(error);
  }
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = tlsLastError;
  tlsLastError = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return tlsLastError; }

cudaError_t cudaDriverGetVersion(int* version) {
  if (!version) return fail(cudaErrorInvalidValue);
  *version = 13000;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (!version) return fail(cudaErrorInvalidValue);
  *version = 13000;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = deviceCount();
  return *count > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= deviceCount()) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "cudasim emulated GPU %d", config().visible[static_cast<size_t>(device)]);
  prop->totalGlobalMem = config().memoryBytes;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 4;
  prop->memoryBusWidth = 512;
  prop->l2CacheSize = 4 << 20;
  prop->pciBusID = config().visible[static_cast<size_t>(device)] + 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= deviceCount()) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      return cudaSuccess;
    case cudaDevAttrClockRate:
      *value = 1000000;  // kHz
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = 4;
      return cudaSuccess;
    case cudaDevAttrMemoryClockRate:
      *value = 2000000;
      return cudaSuccess;
  }
  return fail(cudaErrorInvalidValue);
}

cudaError_t cudaDeviceGetPCIBusId(char* pciBusId, int len, int device) {
  if (!pciBusId || len <= 0) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= deviceCount()) return fail(cudaErrorInvalidDevice);
  std::snprintf(pciBusId, static_cast<size_t>(len), "0000:%02X:00.0", config().visible[static_cast<size_t>(device)] + 1);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetByPCIBusId(int* device, const char* pciBusId) {
  if (!device || !pciBusId) return fail(cudaErrorInvalidValue);
  for (int d = 0; d < deviceCount(); ++d) {
    char id[32];
    cudaDeviceGetPCIBusId(id, sizeof id, d);
    if (strcasecmp(id, pciBusId) == 0) {
      *device = d;
      return cudaSuccess;
    }
  }
  return fail(cudaErrorInvalidDevice);
}

cudaError_t cudaDeviceCanAccessPeer(int* canAccessPeer, int device, int peerDevice) {
  if (!canAccessPeer) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= deviceCount() || peerDevice < 0 || peerDevice >= deviceCount()) {
    return fail(cudaErrorInvalidDevice);
  }
  *canAccessPeer = device != peerDevice && config().peer ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= deviceCount()) return fail(cudaErrorInvalidDevice);
  tlsDevice = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue);
  if (deviceCount() == 0) return fail(cudaErrorNoDevice);
  *device = tlsDevice;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  if (cudaError_t e = captureCheck(nullptr, CaptureUse::kDeviceWait, tlsDevice)) return fail(e);
  for (CUstream_st* s : streamsOf(tlsDevice)) synchronizeStream(s);
  return cudaSuccess;
}

}  // extern "C"
