#include "collectives/nccl/node_rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iomanip>
#include <new>
#include <sstream>

#include "ipc/backoff.h"
#include "ipc/process_liveness.h"
#include "ipc/shm_names.h"
#include "ipc/shm_region.h"
#include "runtime/error.h"

namespace cohort::collectives::nccl {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kMagic = 0x5a444e524c43434eull;  // "NCCLRNDZ" read little-endian
constexpr size_t kBusIdBytes = 64;
constexpr size_t kHeaderBytes = 256;  // the header, padded; the slots follow
// The segment has room for this many local ranks whatever the local world size, so that ranks that
// disagree on it still meet and get a clear message instead of a size mismatch.
constexpr int kMaxLocalRanks = 256;

struct Header {
  uint64_t magic;
  int32_t localWorldSize;
  uint32_t hasUniqueId;
  std::atomic<uint32_t> closed;  // local rank 0 saw every slot ready and removed the name
  uint8_t uniqueId[kUniqueIdBytes];
};

struct alignas(64) Slot {
  std::atomic<uint32_t> state;  // 0 free, 2 claimed by its rank, 1 filled (stored last, release order)
  int32_t rank;
  int32_t deviceIndex;
  int32_t pid;
  char busId[kBusIdBytes];  // NUL-terminated
};

static_assert(sizeof(Header) <= kHeaderBytes);

std::string seconds(std::chrono::milliseconds d) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << d.count() / 1000.0 << " s";
  return os.str();
}

// The segment's payload seen as a header and slots.
class Layout {
 public:
  explicit Layout(void* payload) : base_(static_cast<char*>(payload)) {}
  Header& header() const { return *reinterpret_cast<Header*>(base_); }
  Slot& slot(int localRank) const { return reinterpret_cast<Slot*>(base_ + kHeaderBytes)[localRank]; }

 private:
  char* base_;
};

void fillSlot(Slot& slot, const NodeRendezvousOptions& o, const MyGpu& mine) {
  slot.rank = o.rank;
  slot.deviceIndex = mine.deviceIndex;
  slot.pid = static_cast<int32_t>(::getpid());
  std::memset(slot.busId, 0, kBusIdBytes);
  std::memcpy(slot.busId, mine.busId.data(), mine.busId.size());
  slot.state.store(1, std::memory_order_release);
}

std::vector<int> missingRanks(const Layout& layout, int localWorldSize) {
  std::vector<int> missing;
  for (int k = 0; k < localWorldSize; ++k) {
    if (layout.slot(k).state.load(std::memory_order_acquire) != 1) missing.push_back(k);
  }
  return missing;
}

// "local ranks 2, 3 of 4"
std::string describeMissing(const std::vector<int>& missing, int localWorldSize) {
  std::ostringstream os;
  os << (missing.size() == 1 ? "local rank " : "local ranks ");
  for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
  os << " of " << localWorldSize;
  return os.str();
}

[[noreturn]] void throwTimeout(const NodeRendezvousOptions& o, const std::vector<int>& missing) {
  std::ostringstream os;
  os << "nccl rendezvous on this node (job " << ipc::sanitizeJobId(o.jobId) << ", local rank " << o.localRank << "): ";
  if (missing.empty())
    os << "every local rank arrived, but local rank 0 did not close the rendezvous";
  else
    os << describeMissing(missing, o.localWorldSize) << " did not arrive";
  os << " within " << seconds(o.timeout);
  throw TimeoutError(os.str());
}

// Waits until `done()` or the deadline; an opener also watches local rank 0, the creator.
template <class Done>
void waitUntil(Done done, const ipc::ShmRegion& region, const NodeRendezvousOptions& o, const Layout& layout,
               Clock::time_point deadline) {
  ipc::Backoff backoff(std::chrono::milliseconds(2));
  Clock::time_point nextLivenessCheck = Clock::now();
  while (!done()) {
    const Clock::time_point now = Clock::now();
    if (now >= deadline) throwTimeout(o, missingRanks(layout, o.localWorldSize));
    if (!region.isCreator() && now >= nextLivenessCheck) {
      // Checked again after the liveness test: local rank 0 may have closed and exited meanwhile.
      if (!ipc::processIsAlive(region.creatorPid(), region.creatorStartTicks()) && !done()) {
        // Usually local rank 0 gave up waiting for the same missing ranks a moment earlier.
        const std::vector<int> missing = missingRanks(layout, o.localWorldSize);
        COHORT_THROW(PeerError) << "nccl rendezvous on this node: local rank 0 (pid " << region.creatorPid()
                                << ") exited before "
                                << (missing.empty() ? std::string("closing the rendezvous")
                                                    : describeMissing(missing, o.localWorldSize) + " arrived");
      }
      nextLivenessCheck = now + std::chrono::milliseconds(20);  // each check reads /proc
    }
    backoff.pause();
  }
}

NodeRendezvousResult readResult(const Layout& layout, int localWorldSize) {
  NodeRendezvousResult result;
  for (int k = 0; k < localWorldSize; ++k) {
    const Slot& s = layout.slot(k);
    result.gpus.push_back({.rank = s.rank,
                           .localRank = k,
                           .deviceIndex = s.deviceIndex,
                           .busId = std::string(s.busId, strnlen(s.busId, kBusIdBytes))});
  }
  const Header& h = layout.header();
  if (h.hasUniqueId) {
    UniqueIdBytes id;
    std::memcpy(id.data(), h.uniqueId, kUniqueIdBytes);
    result.uniqueId = id;
  }
  return result;
}

void checkOptions(const NodeRendezvousOptions& o, const MyGpu& mine) {
  if (o.localWorldSize < 1 || o.localWorldSize > kMaxLocalRanks || o.localRank < 0 || o.localRank >= o.localWorldSize) {
    COHORT_THROW(InvalidArgument) << "nccl rendezvous: local rank " << o.localRank << " of " << o.localWorldSize
                                  << " is not a valid local rank (at most " << kMaxLocalRanks << " per node)";
  }
  if (mine.busId.size() >= kBusIdBytes) {
    COHORT_THROW(InvalidArgument) << "nccl rendezvous: PCI bus id '" << mine.busId << "' is longer than "
                                  << kBusIdBytes - 1 << " characters";
  }
}

}  // namespace

NodeRendezvousResult rendezvousOnNode(const NodeRendezvousOptions& o, const MyGpu& mine,
                                      const std::function<UniqueIdBytes()>& makeUniqueId) {
  checkOptions(o, mine);
  if (o.localWorldSize == 1) {
    // Alone on the node: nobody to meet, and no segment (single processes share the job id "local").
    NodeRendezvousResult alone;
    alone.gpus.push_back({.rank = o.rank, .localRank = 0, .deviceIndex = mine.deviceIndex, .busId = mine.busId});
    if (makeUniqueId) alone.uniqueId = makeUniqueId();
    return alone;
  }
  const Clock::time_point deadline = Clock::now() + o.timeout;
  const size_t payload = kHeaderBytes + kMaxLocalRanks * sizeof(Slot);
  if (o.localRank == 0) {
    // unlinkOnDestroy: whatever happens below, no name is left behind.
    ipc::ShmRegion region = ipc::ShmRegion::create({.jobId = o.jobId,
                                                    .name = o.name,
                                                    .payloadBytes = payload,
                                                    .generation = o.generation,
                                                    .unlinkOnDestroy = true});
    Layout layout(region.payload());
    Header& h = *new (region.payload()) Header{};
    for (int k = 0; k < kMaxLocalRanks; ++k) new (&layout.slot(k)) Slot{};
    h.magic = kMagic;
    h.localWorldSize = o.localWorldSize;
    if (makeUniqueId) {
      const UniqueIdBytes id = makeUniqueId();
      std::memcpy(h.uniqueId, id.data(), kUniqueIdBytes);
      h.hasUniqueId = 1;
    }
    fillSlot(layout.slot(0), o, mine);
    region.publish();
    waitUntil([&] { return missingRanks(layout, o.localWorldSize).empty(); }, region, o, layout, deadline);
    // The name goes before anyone leaves, so a next rendezvous can only find its own segment.
    region.unlink();
    h.closed.store(1, std::memory_order_release);
    return readResult(layout, o.localWorldSize);
  }

  const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  ipc::ShmRegion region =
      ipc::ShmRegion::open({.jobId = o.jobId,
                            .name = o.name,
                            .payloadBytes = payload,
                            .generation = o.generation,
                            .timeout = std::max(remaining, std::chrono::milliseconds(0)),
                            .creatorDescription = "local rank 0 (which starts the nccl rendezvous)"});
  Layout layout(region.payload());
  const Header& h = layout.header();
  if (h.magic != kMagic) {
    COHORT_THROW(IoError) << region.path() << " is not an nccl rendezvous segment (bad magic)";
  }
  if (h.localWorldSize != o.localWorldSize) {
    COHORT_THROW(InvalidArgument) << "nccl rendezvous: local rank " << o.localRank << " was told " << o.localWorldSize
                                  << " ranks on this node, but local rank 0 was told " << h.localWorldSize
                                  << " (are all ranks started by the same launcher?)";
  }
  Slot& own = layout.slot(o.localRank);
  uint32_t expected = 0;
  if (!own.state.compare_exchange_strong(expected, 2, std::memory_order_acq_rel)) {
    COHORT_THROW(InvalidArgument) << "nccl rendezvous: local rank " << o.localRank << " arrived twice (this is pid "
                                  << ::getpid() << "): two processes were given the same local rank";
  }
  fillSlot(own, o, mine);
  waitUntil([&] { return h.closed.load(std::memory_order_acquire) != 0; }, region, o, layout, deadline);
  return readResult(layout, o.localWorldSize);
}

}  // namespace cohort::collectives::nccl
