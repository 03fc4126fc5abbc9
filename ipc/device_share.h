// DeviceShare: GPU Hogwild's one copy of the parameters (docs/gpu.md, "Hogwild on a GPU"): a dedicated device
// allocation owned by local rank 0 and opened by the other local ranks through a CUDA IPC handle
// that the owner publishes in a job segment, segmentName(jobId, "gpu-params").
//
// Owner (local rank 0): allocates with DeviceMemory::allocate (one cudaMalloc of its own, never a
// block of the caching allocator, whose blocks share allocations that IPC would export whole),
// runs the initialiser on it, exports the handle and publishes the record {bytes, the owner's GPU,
// handle} with a slot per local rank. Importers (every other local rank): wait for the record (up to
// the timeout), check it, open the handle and mark their slot attached. Checks, each an
// InvalidArgument naming both sides:
//   - the record was published by this very process: CUDA cannot open a handle in the process that
//     exported it (two ranks in one process is a launch mistake);
//   - a different size (the ranks built different models);
//   - the owner's GPU is another one this GPU cannot reach (no peer access).
// The owner outlives every importer: its destructor marks the share closing and waits (up to the
// timeout) until every attached importer has detached or died, and only then frees the memory.
// Importers watch the owner from a thread of their own, every ownerCheckInterval (its pid and start
// time, from the segment header, so a reused pid is not mistaken for it). Once it has gone,
// throwIfOwnerLost() throws PeerError naming it; the training loop calls that every step, so a
// lost owner is reported within the interval plus one step, well inside the timeout.
//
// The device calls sit behind DeviceMemory so that all of the above runs in tests without a GPU
// (tests/ipc/device_share_test.cc); ipc/cuda_device_memory.h implements it with the CUDA runtime.
// Ownership: owns the allocation (owner) or the opened mapping (importer), and the segment mapping.
// Thread safety: data() is raw device memory shared without locks (Hogwild); the rest from the
// owning thread, except that throwIfOwnerLost() may be called from any thread.
//
//   CudaDeviceMemory memory(Device::cuda(world.localRank));
//   DeviceShare share(memory, {.jobId = world.jobId, .localRank = world.localRank,
//                              .localWorldSize = world.localWorldSize, .bytes = numel * 4},
//                     [&](void* p, size_t n) { copyToDevice(p, initial, n); });
//   params.attach(static_cast<float*>(share.data()), device, allocator);
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "ipc/shm_region.h"

namespace cohort::ipc {

inline constexpr size_t kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)
using IpcHandle = std::array<uint8_t, kIpcHandleBytes>;

// The device calls DeviceShare needs. Every call throws cohort::Error (OutOfMemory for allocate)
// on failure, except release and close, which are called from destructors and must not throw.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // This process's GPU, unique on the node (its PCI bus id), e.g. "0000:3B:00.0".
  virtual std::string deviceId() const = 0;
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* ptr) noexcept = 0;
  virtual IpcHandle exportHandle(void* ptr) = 0;
  // Whether this process's GPU can use memory on the GPU `deviceId` (the same one, or peer access).
  virtual bool canAccess(const std::string& deviceId) const = 0;
  virtual void* open(const IpcHandle& handle) = 0;
  virtual void close(void* ptr) noexcept = 0;
};

class DeviceShare {
 public:
  struct Options {
    std::string jobId;
    int localRank = 0;
    int localWorldSize = 1;
    size_t bytes = 0;
    uint64_t generation = 0;  // the job's restart count, as for SharedParams
    // Importers' wait for the owner's record; the owner's wait for importers to detach.
    std::chrono::milliseconds timeout{std::chrono::seconds(60)};
    std::chrono::milliseconds ownerCheckInterval{std::chrono::milliseconds(200)};
    std::string name = "gpu-params";
  };
  // Called by the owner only, on its fresh allocation, before anyone else can see it.
  using Initializer = std::function<void(void* device, size_t bytes)>;

  // Throws as described at the top; plus what ShmRegion::create/open throw (TimeoutError when the
  // owner never publishes, PeerError when it died before publishing).
  DeviceShare(DeviceMemory& memory, const Options& options, const Initializer& initialise);
  ~DeviceShare();
  DeviceShare(const DeviceShare&) = delete;
  DeviceShare& operator=(const DeviceShare&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool isOwner() const { return region_.isCreator(); }
  // Importers: PeerError once the owner has gone (never throws on the owner). With `settle` > 0 it
  // also looks at the owner's process itself, for up to that long, instead of only at what the
  // watcher has seen: for a caller whose GPU work just failed, which is how an importer usually
  // learns first that the owner's memory is gone.
  void throwIfOwnerLost(std::chrono::milliseconds settle = std::chrono::milliseconds(0)) const;
  // Removes the segment's name once every rank has attached (e.g. after the first barrier).
  void unlinkName() { region_.unlink(); }

  // Payload bytes of the segment for `localWorldSize` ranks.
  static size_t payloadBytes(int localWorldSize);

 private:
  struct Record;
  struct Slot;
  Record& record() const;
  Slot& slot(int localRank) const;
  void importFromOwner(const Options& options);
  void waitForImporters(std::chrono::milliseconds timeout) const;
  void watchOwner(std::chrono::milliseconds interval);

  DeviceMemory& memory_;
  ShmRegion region_;
  int localRank_;
  int localWorldSize_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::chrono::milliseconds timeout_;
  pid_t ownerPid_ = 0;
  uint64_t ownerStartTicks_ = 0;
  mutable std::atomic<bool> ownerLost_{false};  // set by the watcher, or by throwIfOwnerLost(settle)
  std::atomic<bool> stopWatching_{false};
  std::thread watcher_;  // importers only
};

}  // namespace cohort::ipc
