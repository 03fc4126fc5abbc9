// Device and pinned memory as cudasim emulates them (include/cuda_runtime.h), with copies, sets
// and IPC handles.
//
// Device memory is host memory of a memfd mapping (so that an IPC handle can name it to another
// process) with guard pages' worth of a pattern before and after that cudaFree checks, filled with
// 0xFF bytes (NaN as floats) when allocated so that reading what nobody wrote shows; freed memory
// stays mapped without access for a while, so a late access faults instead of reading someone
// else's data. Copies follow CUDA's rules for host memory: from pageable memory the source is taken
// at the call, into pageable memory the call returns when the copy is done, and pinned memory is
// read and written when the stream gets there.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cudasim/capture.h"
#include "cudasim/runtime.h"
#include "cudasim/sim.h"

namespace cudasim {
namespace {

constexpr size_t kGuard = 4096;  // bytes of pattern before and after every device allocation
constexpr unsigned char kGuardByte = 0xCD;
constexpr size_t kQuarantineBytes = size_t{256} << 20;

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

bool isDeviceRange(const void* p, size_t bytes) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  return findDevice(r, p, bytes) != nullptr;
}

}  // namespace cudasim

using namespace cudasim;

extern "C" {

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
