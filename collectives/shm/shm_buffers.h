// Shared buffers of the shm backend: memory that every local rank can map, so an all-reduce whose
// input and output lie in it skips the staging copies (docs/collectives.md, "Shared buffers").
//
// Communicator::allocateBuffer() is collective: every rank creates one segment,
// segmentName(jobId, "<scope>buf-<rank>-<id>") (scope: "" for the job's communicator, the group's
// for a split one: ShmEngine::Options::scope) (ids count allocations, so they agree across ranks), every
// rank maps every peer's, and then each owner removes its name, so a crash later leaves nothing in
// /dev/shm. A collective names its buffers to the peers by BufferRef (owner's id and byte offset,
// published with the fingerprint), which a peer looks up among its mappings. An owner that frees its
// buffer marks it freed; peers drop their mapping of it at the next allocation.
//
// Ownership: BufferRegistry is shared by the communicator and its buffers (a buffer may outlive
// neither the communicator's job nor the registry: it holds a reference). PeerBuffers owns the
// mappings of peers' buffers.
// Thread safety: BufferRegistry is internally locked (buffers are allocated and freed on the issuing
// thread, looked up at issue). PeerBuffers belongs to the thread that runs the engine.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "collectives/communicator.h"
#include "ipc/shm_region.h"

namespace cohort::collectives::shm {

// Where a collective's buffer lies: owner rank's buffer `id` (0 = not in a shared buffer) of
// `bufferBytes` data bytes, at `offset` bytes into its data.
struct BufferRef {
  uint64_t id = 0;
  uint64_t offset = 0;
  uint64_t bufferBytes = 0;
  bool shared() const { return id != 0; }
};

// At the start of each buffer segment's payload; the data follows at kBufferDataOffset.
struct BufferHeader {
  std::atomic<uint32_t> freed;  // set by the owner before it unmaps
  uint64_t dataBytes;
};
inline constexpr size_t kBufferDataOffset = 64;

std::string bufferSegmentName(const std::string& scope, int rank, uint64_t id);  // "<scope>buf-<rank>-<id>"

class BufferRegistry : public std::enable_shared_from_this<BufferRegistry> {
 public:
  BufferRegistry(std::string jobId, std::string scope, int rank, uint64_t generation)
      : jobId_(std::move(jobId)), scope_(std::move(scope)), rank_(rank), generation_(generation) {}

  // A zero-filled buffer of `count` floats in a new segment (count 0 gives an empty buffer).
  // shareWithPeers(id, dataBytes) runs once the segment is published and must return once every
  // peer has mapped it; then the name is removed.
  BufferPtr allocate(size_t count, const std::function<void(uint64_t, size_t)>& shareWithPeers);
  // The ref of [data, data + bytes) when it lies inside one live buffer of this rank, else id 0.
  BufferRef find(const void* data, size_t bytes) const;

 private:
  class SharedBuffer;
  void forget(uintptr_t address);

  const std::string jobId_;
  const std::string scope_;
  const int rank_;
  const uint64_t generation_;
  mutable std::mutex mutex_;
  uint64_t nextId_ = 1;
  struct Entry {
    uint64_t id;
    size_t bytes;
  };
  std::map<uintptr_t, Entry> buffers_;  // by data address
};

// Thread safety: internally locked (open() runs on the allocating thread, find() on the engine's).
class PeerBuffers {
 public:
  PeerBuffers(std::string jobId, std::string scope, uint64_t generation, std::chrono::milliseconds timeout)
      : jobId_(std::move(jobId)), scope_(std::move(scope)), generation_(generation), timeout_(timeout) {}

  // Maps rank `owner`'s buffer `id` of `dataBytes` (published by now); first drops the mappings of
  // buffers their owners have freed. Throws TimeoutError/IoError from the mapping.
  void open(int owner, uint64_t id, size_t dataBytes);
  // The address, in this process, of `bytes` bytes at rank `owner`'s `ref`. Throws InvalidArgument
  // when that buffer is not mapped here (it was not allocated collectively) or the range lies outside.
  float* find(int owner, BufferRef ref, size_t bytes) const;

 private:
  const std::string jobId_;
  const std::string scope_;
  const uint64_t generation_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  std::map<std::pair<int, uint64_t>, ipc::ShmRegion> mapped_;
};

}  // namespace cohort::collectives::shm
