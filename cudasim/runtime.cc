// The CUDA runtime as cudasim emulates it (include/cuda_runtime.h, include/cudasim/sim.h).
//
// Devices are numbers with properties. Device memory is host memory of a memfd mapping (so that an
// IPC handle can name it to another process) with guard pages' worth of a pattern before and after
// that cudaFree checks, filled with 0xFF bytes (NaN as floats) when allocated so that reading what
// nobody wrote shows; freed memory stays mapped without access for a while, so a late access faults
// instead of reading someone else's data. Streams are in-order queues, each run by a thread of its
// own that waits a random few microseconds before each operation. Events carry generations: a wait
// on a stream waits for the generation recorded when the wait was enqueued. Copies follow CUDA's
// rules for host memory: from pageable memory the source is taken at the call, into pageable memory
// the call returns when the copy is done, and pinned memory is read and written when the stream
// gets there.
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cudasim/capture.h"
#include "cudasim/sim.h"

struct CUstream_st {
  int device = 0;
  unsigned flags = 0;
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  uint64_t enqueued = 0, done = 0;
  bool stopping = false;
  std::mt19937_64 rng;
};

struct CUevent_st {
  unsigned flags = 0;
  std::mutex m;
  std::condition_variable cv;
  uint64_t recorded = 0, completed = 0;
  std::chrono::steady_clock::time_point time;
};

namespace cudasim {
namespace {

constexpr int kMaxDevices = 16;
constexpr size_t kGuard = 4096;  // bytes of pattern before and after every device allocation
constexpr unsigned char kGuardByte = 0xCD;
constexpr size_t kQuarantineBytes = size_t{256} << 20;

struct Config {
  int devices = 2;
  size_t memoryBytes = size_t{2048} << 20;
  bool peer = true;
  unsigned delayUs = 200;
  uint64_t seed = 0;
  std::vector<int> visible;  // visible index -> emulated GPU
};

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

struct Allocation {
  char* mapping = nullptr;  // kGuard + bytes + kGuard
  size_t bytes = 0;
  int device = 0;
  int fd = -1;              // the memfd (owner); -1 for an imported mapping
  ino_t inode = 0;
  bool imported = false;
};

struct Registry {
  std::mutex m;
  std::map<uintptr_t, Allocation> device;  // by the pointer handed out
  std::map<uintptr_t, size_t> pinned;
  std::set<CUstream_st*> streams;
  std::set<CUevent_st*> events;
  CUstream_st* defaults[kMaxDevices] = {};
  size_t used[kMaxDevices] = {};
  std::deque<std::pair<char*, size_t>> quarantine;  // freed mappings, inaccessible, oldest first
  size_t quarantined = 0;
};

Registry* gRegistry = nullptr;

// A forked child starts with a fresh device state, as a new process would: the parent's streams have
// no threads there, and another thread may have held the registry's lock at the fork.
void resetAfterFork() {
  gRegistry = new Registry;  // the parent's copy is left as it was (its lock may be held)
  tlsDevice = 0;
  tlsLastError = cudaSuccess;
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

// The allocation holding [p, p + bytes), or nullptr. Caller holds the registry's lock.
Allocation* findDevice(Registry& r, const void* p, size_t bytes) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = r.device.upper_bound(addr);
  if (it == r.device.begin()) return nullptr;
  --it;
  if (addr + bytes > it->first + it->second.bytes || addr < it->first) return nullptr;
  return &it->second;
}

bool findPinned(Registry& r, const void* p, size_t bytes) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  auto it = r.pinned.upper_bound(addr);
  if (it == r.pinned.begin()) return false;
  --it;
  return addr >= it->first && addr + bytes <= it->first + it->second;
}

void workerLoop(CUstream_st* s) {
  for (;;) {
    std::function<void()> op;
    {
      std::unique_lock lock(s->m);
      s->cv.wait(lock, [&] { return s->stopping || !s->queue.empty(); });
      if (s->queue.empty()) break;
      op = std::move(s->queue.front());
      s->queue.pop_front();
    }
    if (const unsigned delay = config().delayUs) {
      std::this_thread::sleep_for(std::chrono::microseconds(s->rng() % (delay + 1)));
    }
    op();
    {
      std::lock_guard lock(s->m);
      ++s->done;
    }
    s->cv.notify_all();
  }
  delete s;  // a destroyed stream goes once its work is done
}

CUstream_st* newStream(int device, unsigned flags) {
  auto* s = new CUstream_st;
  s->device = device;
  s->flags = flags;
  s->rng.seed(nextSeed());
  std::thread(workerLoop, s).detach();
  return s;
}

// The stream an API call names: the current device's default stream for nullptr, or nullptr when
// `stream` is not a live stream.
CUstream_st* resolve(cudaStream_t stream) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  if (!stream || stream == cudaStreamLegacy) {
    CUstream_st*& d = r.defaults[tlsDevice];
    if (!d) d = newStream(tlsDevice, cudaStreamDefault);
    return d;
  }
  return r.streams.count(stream) ? stream : nullptr;
}

// An op of a capturing stream goes into its capture instead (graph.cc); its ticket is then 0.
uint64_t push(CUstream_st* s, std::function<void()> op) {
  if (captureTake(s, op)) return 0;
  std::lock_guard lock(s->m);
  s->queue.push_back(std::move(op));
  const uint64_t ticket = ++s->enqueued;
  s->cv.notify_all();
  return ticket;
}

void waitFor(CUstream_st* s, uint64_t ticket) {
  std::unique_lock lock(s->m);
  s->cv.wait(lock, [&] { return s->done >= ticket; });
}

void synchronizeStream(CUstream_st* s) {
  uint64_t ticket;
  {
    std::lock_guard lock(s->m);
    ticket = s->enqueued;
  }
  waitFor(s, ticket);
}

std::vector<CUstream_st*> streamsOf(int device) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  std::vector<CUstream_st*> all;
  for (CUstream_st* s : r.streams) {
    if (s->device == device) all.push_back(s);
  }
  if (r.defaults[device]) all.push_back(r.defaults[device]);
  return all;
}

[[noreturn]] void corrupted(const void* p, size_t bytes, const char* where) {
  std::fprintf(stderr,
               "cudasim: the device buffer of %zu bytes at %p was written %s its bounds (by a kernel or a copy)\n",
               bytes, p, where);
  std::abort();
}

void checkGuards(const Allocation& a) {
  const char* user = a.mapping + kGuard;
  for (size_t i = 0; i < kGuard; ++i) {
    if (static_cast<unsigned char>(a.mapping[i]) != kGuardByte) corrupted(user, a.bytes, "before");
    if (static_cast<unsigned char>(user[a.bytes + i]) != kGuardByte) corrupted(user, a.bytes, "past");
  }
}

enum class Where { kDevice, kPinned, kPageable };

Where classify(Registry& r, const void* p, size_t bytes) {
  if (findDevice(r, p, bytes)) return Where::kDevice;
  if (findPinned(r, p, bytes)) return Where::kPinned;
  return Where::kPageable;
}

// A copy's direction against where its ends are; cudaMemcpyDefault takes whatever they are.
bool kindMatches(cudaMemcpyKind kind, Where dst, Where src) {
  const bool dDev = dst == Where::kDevice, sDev = src == Where::kDevice;
  switch (kind) {
    case cudaMemcpyHostToHost:
      return !dDev && !sDev;
    case cudaMemcpyHostToDevice:
      return dDev && !sDev;
    case cudaMemcpyDeviceToHost:
      return !dDev && sDev;
    case cudaMemcpyDeviceToDevice:
      return dDev && sDev;
    case cudaMemcpyDefault:
      return true;
  }
  return false;
}

// A device pointer that lies partly outside its allocation is an error at the call (the real
// runtime would fault later, or not at all).
bool straddles(Registry& r, const void* p, size_t bytes) {
  if (findDevice(r, p, bytes)) return false;
  return findDevice(r, p, 1) != nullptr || (bytes > 0 && findDevice(r, static_cast<const char*>(p) + bytes - 1, 1));
}

cudaError_t copy(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream, bool sync) {
  if (count == 0) return cudaSuccess;
  if (!dst || !src) return fail(cudaErrorInvalidValue);
  CUstream_st* s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  Where d, w;
  {
    Registry& r = registry();
    std::lock_guard lock(r.m);
    if (straddles(r, dst, count) || straddles(r, src, count)) return fail(cudaErrorInvalidValue);
    d = classify(r, dst, count);
    w = classify(r, src, count);
  }
  if (!kindMatches(kind, d, w)) return fail(cudaErrorInvalidMemcpyDirection);
  const CaptureUse use = sync                                                 ? CaptureUse::kDeviceWait
                         : d == Where::kPageable || w == Where::kPageable ? CaptureUse::kPageableCopy
                                                                          : CaptureUse::kStreamWork;
  if (cudaError_t e = captureCheck(s, use, tlsDevice)) return fail(e);
  uint64_t ticket;
  if (w == Where::kPageable) {
    // The real runtime stages pageable memory before the call returns: the caller may reuse it.
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + count);
    ticket = push(s, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
  } else {
    ticket = push(s, [dst, src, count] { std::memmove(dst, src, count); });
  }
  if (sync || d == Where::kPageable) waitFor(s, ticket);
  return cudaSuccess;
}

cudaError_t set(void* p, int value, size_t count, cudaStream_t stream, bool sync) {
  if (count == 0) return cudaSuccess;
  CUstream_st* s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  {
    Registry& r = registry();
    std::lock_guard lock(r.m);
    if (!findDevice(r, p, count)) return fail(cudaErrorInvalidValue);
  }
  if (cudaError_t e = captureCheck(s, sync ? CaptureUse::kDeviceWait : CaptureUse::kStreamWork, tlsDevice)) {
    return fail(e);
  }
  const uint64_t ticket = push(s, [p, value, count] { std::memset(p, value, count); });
  if (sync) waitFor(s, ticket);
  return cudaSuccess;
}

bool validEvent(cudaEvent_t e) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  return r.events.count(e) != 0;
}

struct IpcRecord {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t inode;
  uint64_t bytes;
  int32_t device;
};
static_assert(sizeof(IpcRecord) <= sizeof(cudaIpcMemHandle_t));
constexpr char kIpcMagic[8] = {'c', 'u', 'd', 'a', 's', 'i', 'm', '1'};

}  // namespace

uint64_t nextSeed() {
  static std::atomic<uint64_t> counter{0};
  uint64_t z = config().seed + 0x9e3779b97f4a7c15ull * (counter.fetch_add(1) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

cudaError_t enqueue(cudaStream_t stream, std::function<void()> op) {
  CUstream_st* s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = captureCheck(s, CaptureUse::kStreamWork, tlsDevice)) return fail(e);
  push(s, std::move(op));
  return cudaSuccess;
}

cudaStream_t resolveStream(cudaStream_t stream) { return resolve(stream); }
int streamDevice(cudaStream_t stream) { return stream->device; }
int currentDevice() { return tlsDevice; }
cudaError_t failWith(cudaError_t error) { return fail(error); }

bool isDeviceRange(const void* p, size_t bytes) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  return findDevice(r, p, bytes) != nullptr;
}

void launchKernel(const LaunchConfig& c, std::function<void()> body) {
  const uint64_t threads = uint64_t{c.block.x} * c.block.y * c.block.z;
  if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || threads == 0 || threads > 1024 || c.block.z > 64 ||
      c.grid.y > 65535 || c.grid.z > 65535 || c.sharedBytes > 48 * 1024) {
    fail(cudaErrorInvalidConfiguration);
    return;
  }
  CUstream_st* s = resolve(c.stream);
  if (!s) {
    fail(cudaErrorInvalidResourceHandle);
    return;
  }
  if (cudaError_t e = captureCheck(s, CaptureUse::kStreamWork, tlsDevice)) {
    fail(e);
    return;
  }
  const uint64_t seed = nextSeed();
  push(s, [c, body = std::move(body), seed] { runGrid(c, body, seed); });
}

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

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (!free || !total) return fail(cudaErrorInvalidValue);
  Registry& r = registry();
  std::lock_guard lock(r.m);
  *total = config().memoryBytes;
  *free = config().memoryBytes - r.used[tlsDevice];
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  if (!devPtr) return fail(cudaErrorInvalidValue);
  if (deviceCount() == 0) return fail(cudaErrorNoDevice);
  *devPtr = nullptr;
  if (size == 0) return cudaSuccess;
  if (cudaError_t e = captureCheck(nullptr, CaptureUse::kUnsafe, tlsDevice)) return fail(e);
  Registry& r = registry();
  {
    std::lock_guard lock(r.m);
    if (size > config().memoryBytes - r.used[tlsDevice]) return fail(cudaErrorMemoryAllocation);
    r.used[tlsDevice] += size;
  }
  const size_t mapped = kGuard + ((size + kGuard - 1) / kGuard) * kGuard + kGuard;
  int fd = memfd_create("cudasim-device-memory", MFD_CLOEXEC);
  void* m = MAP_FAILED;
  struct stat st {};
  if (fd >= 0 && ftruncate(fd, static_cast<off_t>(mapped)) == 0 && fstat(fd, &st) == 0) {
    m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (m == MAP_FAILED) {
    if (fd >= 0) close(fd);
    std::lock_guard lock(r.m);
    r.used[tlsDevice] -= size;
    return fail(cudaErrorMemoryAllocation);
  }
  char* mapping = static_cast<char*>(m);
  std::memset(mapping, kGuardByte, kGuard);
  std::memset(mapping + kGuard, 0xFF, size);  // NaN as floats: reading what nobody wrote shows
  std::memset(mapping + kGuard + size, kGuardByte, mapped - kGuard - size);
  Allocation a{.mapping = mapping, .bytes = size, .device = tlsDevice, .fd = fd, .inode = st.st_ino};
  {
    std::lock_guard lock(r.m);
    r.device[reinterpret_cast<uintptr_t>(mapping + kGuard)] = a;
  }
  *devPtr = mapping + kGuard;
  return cudaSuccess;
}

cudaError_t cudaFree(void* devPtr) {
  if (!devPtr) return cudaSuccess;
  Registry& r = registry();
  Allocation a;
  {
    std::lock_guard lock(r.m);
    auto it = r.device.find(reinterpret_cast<uintptr_t>(devPtr));
    if (it == r.device.end() || it->second.imported) return fail(cudaErrorInvalidValue);
    a = it->second;
  }
  // cudaFree synchronises the device, as the real one does: work already enqueued may finish.
  if (cudaError_t e = captureCheck(nullptr, CaptureUse::kDeviceWait, tlsDevice)) return fail(e);
  cudaDeviceSynchronize();
  checkGuards(a);
  std::lock_guard lock(r.m);
  r.device.erase(reinterpret_cast<uintptr_t>(devPtr));
  r.used[a.device] -= a.bytes;
  close(a.fd);  // an IPC handle to it no longer opens
  const size_t mapped = kGuard + ((a.bytes + kGuard - 1) / kGuard) * kGuard + kGuard;
  mprotect(a.mapping, mapped, PROT_NONE);  // a late access faults instead of reading reused memory
  r.quarantine.emplace_back(a.mapping, mapped);
  r.quarantined += mapped;
  while (r.quarantined > kQuarantineBytes) {
    munmap(r.quarantine.front().first, r.quarantine.front().second);
    r.quarantined -= r.quarantine.front().second;
    r.quarantine.pop_front();
  }
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int) {
  if (!pHost) return fail(cudaErrorInvalidValue);
  *pHost = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
  if (!p) return fail(cudaErrorMemoryAllocation);
  Registry& r = registry();
  std::lock_guard lock(r.m);
  r.pinned[reinterpret_cast<uintptr_t>(p)] = size;
  *pHost = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void* ptr) {
  if (!ptr) return cudaSuccess;
  Registry& r = registry();
  {
    std::lock_guard lock(r.m);
    if (!r.pinned.erase(reinterpret_cast<uintptr_t>(ptr))) return fail(cudaErrorInvalidValue);
  }
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (!attributes) return fail(cudaErrorInvalidValue);
  Registry& r = registry();
  std::lock_guard lock(r.m);
  *attributes = cudaPointerAttributes{};
  if (Allocation* a = findDevice(r, ptr, 1)) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = a->device;
    attributes->devicePointer = const_cast<void*>(ptr);
  } else if (findPinned(r, ptr, 1)) {
    attributes->type = cudaMemoryTypeHost;
    attributes->device = tlsDevice;
    attributes->devicePointer = const_cast<void*>(ptr);
    attributes->hostPointer = const_cast<void*>(ptr);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return copy(dst, src, count, kind, nullptr, true);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  return copy(dst, src, count, kind, stream, false);
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) { return set(devPtr, value, count, nullptr, true); }

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  return set(devPtr, value, count, stream, false);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int) {
  if (!stream || (flags & ~1u)) return fail(cudaErrorInvalidValue);
  if (deviceCount() == 0) return fail(cudaErrorNoDevice);
  CUstream_st* s = newStream(tlsDevice, flags);
  Registry& r = registry();
  std::lock_guard lock(r.m);
  r.streams.insert(s);
  *stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  return cudaStreamCreateWithPriority(stream, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithPriority(stream, 0, 0); }

cudaError_t cudaDeviceGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  if (leastPriority) *leastPriority = 0;
  if (greatestPriority) *greatestPriority = -5;
  return cudaSuccess;
}

// Returns at once; the stream's work still runs to its end, then the stream goes.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Registry& r = registry();
  {
    std::lock_guard lock(r.m);
    if (!stream || !r.streams.erase(stream)) return fail(cudaErrorInvalidResourceHandle);
  }
  // Notified under the lock: once it is released the worker may finish the queue and delete the stream.
  std::lock_guard lock(stream->m);
  stream->stopping = true;
  stream->cv.notify_all();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = captureCheck(s, CaptureUse::kStreamWait, tlsDevice)) return fail(e);
  synchronizeStream(s);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = captureCheck(s, CaptureUse::kStreamWait, tlsDevice)) return fail(e);
  std::lock_guard lock(s->m);
  return s->done == s->enqueued ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamGetFlags(cudaStream_t stream, unsigned int* flags) {
  CUstream_st* s = resolve(stream);
  if (!s || !flags) return fail(!s ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
  *flags = s->flags;
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  CUstream_st* s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!validEvent(event)) return fail(cudaErrorInvalidResourceHandle);
  bool captured = false;
  if (cudaError_t e = captureEventWait(s, event, captured)) return fail(e);
  if (captured) return cudaSuccess;
  uint64_t generation;
  {
    std::lock_guard lock(event->m);
    generation = event->recorded;  // what was recorded when the wait was enqueued, as CUDA specifies
  }
  if (generation == 0) return cudaSuccess;  // never recorded: nothing to wait for
  push(s, [event, generation] {
    std::unique_lock lock(event->m);
    event->cv.wait(lock, [&] { return event->completed >= generation; });
  });
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  if (!fn) return fail(cudaErrorInvalidValue);
  return enqueue(stream, [fn, userData] { fn(userData); });
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (!event || (flags & ~3u)) return fail(cudaErrorInvalidValue);
  auto* e = new CUevent_st;
  e->flags = flags;
  Registry& r = registry();
  std::lock_guard lock(r.m);
  r.events.insert(e);
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

// An event is destroyed at once; a wait already enqueued on it still completes (its generation is
// kept by the stream's operation, which the event outlives: events are never freed).
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  if (!event || !r.events.erase(event)) return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!validEvent(event)) return fail(cudaErrorInvalidResourceHandle);
  CUstream_st* s = resolve(stream);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = captureCheck(s, CaptureUse::kStreamWork, tlsDevice)) return fail(e);
  if (captureEventRecord(event, s)) return cudaSuccess;
  uint64_t generation;
  {
    std::lock_guard lock(event->m);
    generation = ++event->recorded;
  }
  push(s, [event, generation] {
    {
      std::lock_guard lock(event->m);
      event->completed = std::max(event->completed, generation);
      event->time = std::chrono::steady_clock::now();
    }
    event->cv.notify_all();
  });
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!validEvent(event)) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = captureEventUse(event)) return fail(e);
  std::lock_guard lock(event->m);
  return event->completed >= event->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!validEvent(event)) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = captureEventUse(event)) return fail(e);
  std::unique_lock lock(event->m);
  const uint64_t generation = event->recorded;
  event->cv.wait(lock, [&] { return event->completed >= generation; });
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return fail(cudaErrorInvalidValue);
  if (!validEvent(start) || !validEvent(end)) return fail(cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
  std::scoped_lock lock(start->m, end->m);
  if (start->recorded == 0 || end->recorded == 0) return fail(cudaErrorInvalidResourceHandle);
  if (start->completed < start->recorded || end->completed < end->recorded) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr) {
  if (!handle) return fail(cudaErrorInvalidValue);
  Registry& r = registry();
  std::lock_guard lock(r.m);
  auto it = r.device.find(reinterpret_cast<uintptr_t>(devPtr));
  if (it == r.device.end() || it->second.imported) return fail(cudaErrorInvalidValue);
  IpcRecord rec{};
  std::memcpy(rec.magic, kIpcMagic, sizeof kIpcMagic);
  rec.pid = ::getpid();
  rec.fd = it->second.fd;
  rec.inode = it->second.inode;
  rec.bytes = it->second.bytes;
  rec.device = config().visible[static_cast<size_t>(it->second.device)];
  *handle = cudaIpcMemHandle_t{};
  std::memcpy(handle->reserved, &rec, sizeof rec);
  return cudaSuccess;
}

// Opens the owner's memory through /proc/<pid>/fd: it fails once the owner has freed it (its
// memfd closed) or exited, where the real driver's behaviour is undefined.
cudaError_t cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned int) {
  if (!devPtr) return fail(cudaErrorInvalidValue);
  IpcRecord rec;
  std::memcpy(&rec, handle.reserved, sizeof rec);
  if (std::memcmp(rec.magic, kIpcMagic, sizeof kIpcMagic) != 0) return fail(cudaErrorInvalidValue);
  if (rec.pid == ::getpid()) return fail(cudaErrorInvalidContext);  // as CUDA: not in the exporting process
  int here = -1;
  for (size_t d = 0; d < config().visible.size(); ++d) {
    if (config().visible[d] == rec.device) here = static_cast<int>(d);
  }
  if (here != tlsDevice && !config().peer) return fail(cudaErrorPeerAccessUnsupported);
  const std::string path = "/proc/" + std::to_string(rec.pid) + "/fd/" + std::to_string(rec.fd);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return fail(cudaErrorMapBufferObjectFailed);
  struct stat st {};
  const size_t mapped = kGuard + ((rec.bytes + kGuard - 1) / kGuard) * kGuard + kGuard;
  if (fstat(fd, &st) != 0 || st.st_ino != rec.inode || static_cast<size_t>(st.st_size) != mapped) {
    close(fd);
    return fail(cudaErrorMapBufferObjectFailed);
  }
  void* m = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return fail(cudaErrorMapBufferObjectFailed);
  char* mapping = static_cast<char*>(m);
  Registry& r = registry();
  std::lock_guard lock(r.m);
  r.device[reinterpret_cast<uintptr_t>(mapping + kGuard)] =
      Allocation{.mapping = mapping, .bytes = rec.bytes, .device = here < 0 ? tlsDevice : here, .imported = true};
  *devPtr = mapping + kGuard;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* devPtr) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  auto it = r.device.find(reinterpret_cast<uintptr_t>(devPtr));
  if (it == r.device.end() || !it->second.imported) return fail(cudaErrorInvalidValue);
  const size_t mapped = kGuard + ((it->second.bytes + kGuard - 1) / kGuard) * kGuard + kGuard;
  munmap(it->second.mapping, mapped);
  r.device.erase(it);
  return cudaSuccess;
}

}  // extern "C"
