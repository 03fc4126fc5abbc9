#include "collectives/shm/shm_buffers.h"

#include <new>

#include "runtime/error.h"

namespace cohort::collectives::shm {

std::string bufferSegmentName(const std::string& scope, int rank, uint64_t id) {
  return scope + "buf-" + std::to_string(rank) + "-" + std::to_string(id);
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
  SharedBuffer(std::shared_ptr<BufferRegistry> registry, ipc::ShmRegion region, size_t count)
      : Buffer(dataOf(region), count), registry_(std::move(registry)), region_(std::move(region)) {}

  ~SharedBuffer() override {
    registry_->forget(reinterpret_cast<uintptr_t>(data()));
    headerOf(region_)->freed.store(1, std::memory_order_release);
  }

 private:
  std::shared_ptr<BufferRegistry> registry_;
  ipc::ShmRegion region_;
};

BufferPtr BufferRegistry::allocate(size_t count, const std::function<void(uint64_t, size_t)>& shareWithPeers) {
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    id = nextId_++;
  }
  const size_t bytes = count * sizeof(float);
  ipc::ShmRegion region = ipc::ShmRegion::create({.jobId = jobId_,
                                                  .name = bufferSegmentName(scope_, rank_, id),
                                                  .payloadBytes = kBufferDataOffset + bytes,
                                                  .generation = generation_,
                                                  .unlinkOnDestroy = true});
  auto* header = new (region.payload()) BufferHeader{};
  header->dataBytes = bytes;
  region.publish();           // the pages are fresh from fallocate: already zero
  shareWithPeers(id, bytes);  // on a throw, region's unlinkOnDestroy removes the name
  region.unlink();
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

void PeerBuffers::open(int owner, uint64_t id, size_t dataBytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = mapped_.begin(); it != mapped_.end();) {
    if (headerOf(it->second)->freed.load(std::memory_order_acquire) != 0) {
      it = mapped_.erase(it);
    } else {
      ++it;
    }
  }
  ipc::ShmRegion region = ipc::ShmRegion::open({.jobId = jobId_,
                                                .name = bufferSegmentName(scope_, owner, id),
                                                .payloadBytes = kBufferDataOffset + dataBytes,
                                                .generation = generation_,
                                                .timeout = timeout_,
                                                .creatorDescription = "rank " + std::to_string(owner)});
  mapped_.insert_or_assign(std::make_pair(owner, id), std::move(region));
}

float* PeerBuffers::find(int owner, BufferRef ref, size_t bytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = mapped_.find(std::make_pair(owner, ref.id));
  if (it == mapped_.end()) {
    COHORT_THROW(InvalidArgument) << "rank " << owner << " named its shared buffer " << ref.id
                                  << ", which this rank has not mapped (allocateBuffer is collective: every rank "
                                     "must call it, in the same order)";
  }
  const uint64_t dataBytes = headerOf(it->second)->dataBytes;
  if (ref.offset > dataBytes || bytes > dataBytes - ref.offset) {
    COHORT_THROW(InvalidArgument) << "rank " << owner << " named bytes [" << ref.offset << ", " << ref.offset + bytes
                                  << ") of its shared buffer " << ref.id << ", which holds " << dataBytes;
  }
  return reinterpret_cast<float*>(reinterpret_cast<char*>(dataOf(it->second)) + ref.offset);
}

}  // namespace cohort::collectives::shm
