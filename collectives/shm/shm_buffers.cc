#include "collectives/shm/shm_buffers.h"

#include <new>

#include "runtime/error.h"

namespace cohort::collectives::shm {

std::string bufferSegmentName(int rank, uint64_t id) {
  return "buf-" + std::to_string(rank) + "-" + std::to_string(id);
}

namespace {
BufferHeader* headerOf(const ipc::ShmRegion& region) { return static_cast<BufferHeader*>(region.payload()); }
float* dataOf(const ipc::ShmRegion& region) {
  return reinterpret_cast<float*>(static_cast<char*>(region.payload()) + kBufferDataOffset);
}
}  // namespace

// One allocateBuffer() result: the owner's mapping of its segment.
class BufferRegistry::SharedBuffer : public Buffer {
 public:
  SharedBuffer(std::shared_ptr<BufferRegistry> registry, ipc::ShmRegion region, size_t count) :
      Buffer(dataOf(region), count), registry_(std::move(registry)), region_(std::move(region)) {}

  ~SharedBuffer() override {
    registry_->forget(reinterpret_cast<uintptr_t>(data()));
    headerOf(region_)->freed.store(1, std::memory_order_release);
    // region_ (unlinkOnDestroy) removes the name if no peer has mapped it yet, then unmaps.
  }

 private:
  std::shared_ptr<BufferRegistry> registry_;
  ipc::ShmRegion region_;
};

BufferPtr BufferRegistry::allocate(size_t count) {
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    id = nextId_++;
  }
  const size_t bytes = count * sizeof(float);
  ipc::ShmRegion region = ipc::ShmRegion::create({.jobId = jobId_,
                                                  .name = bufferSegmentName(rank_, id),
                                                  .payloadBytes = kBufferDataOffset + bytes,
                                                  .generation = generation_,
                                                  .unlinkOnDestroy = true});
  auto* header = new (region.payload()) BufferHeader{};
  header->dataBytes = bytes;
  region.publish();  // the pages are fresh from fallocate: already zero
  const auto address = reinterpret_cast<uintptr_t>(dataOf(region));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    buffers_[address] = {id, bytes};
  }
  return std::make_unique<SharedBuffer>(shared_from_this(), std::move(region), count);
}

void BufferRegistry::forget(uintptr_t address) {
  std::lock_guard<std::mutex> lock(mutex_);
  buffers_.erase(address);
}

BufferRef BufferRegistry::find(const void* data, size_t bytes) const {
  const auto address = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = buffers_.upper_bound(address);
  if (it == buffers_.begin()) return {};
  --it;
  const uintptr_t begin = it->first;
  if (address + bytes > begin + it->second.bytes) return {};
  return {.id = it->second.id, .offset = address - begin, .bufferBytes = it->second.bytes};
}

float* PeerBuffers::map(int owner, BufferRef ref, size_t bytes) {
  const auto key = std::make_pair(owner, ref.id);
  auto it = mapped_.find(key);
  if (it == mapped_.end()) {
    dropFreed();
    // The owner created and published the segment before it issued the collective naming it.
    ipc::ShmRegion region = ipc::ShmRegion::open({.jobId = jobId_,
                                                  .name = bufferSegmentName(owner, ref.id),
                                                  .payloadBytes = kBufferDataOffset + ref.bufferBytes,
                                                  .generation = generation_,
                                                  .timeout = timeout_,
                                                  .creatorDescription = "rank " + std::to_string(owner)});
    if (headerOf(region)->peersMapped.fetch_add(1, std::memory_order_acq_rel) + 1 ==
        static_cast<uint32_t>(numRanks_ - 1)) {
      region.unlink();  // every peer has it mapped: the name is no longer needed
    }
    it = mapped_.emplace(key, std::move(region)).first;
  }
  const uint64_t dataBytes = headerOf(it->second)->dataBytes;
  if (ref.offset > dataBytes || bytes > dataBytes - ref.offset) {
    COHORT_THROW(InvalidArgument) << "rank " << owner << " named bytes [" << ref.offset << ", " << ref.offset + bytes
                                  << ") of its shared buffer " << ref.id << ", which holds " << dataBytes;
  }
  return reinterpret_cast<float*>(reinterpret_cast<char*>(dataOf(it->second)) + ref.offset);
}

void PeerBuffers::dropFreed() {
  for (auto it = mapped_.begin(); it != mapped_.end();) {
    if (headerOf(it->second)->freed.load(std::memory_order_acquire) != 0) {
      it = mapped_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace cohort::collectives::shm
