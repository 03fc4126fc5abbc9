#include "ipc/device_share.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <thread>

#include "ipc/process_liveness.h"
#include "runtime/error.h"

namespace cohort::ipc {
namespace {

constexpr uint64_t kRecordMagic = 0x5048534543495644ull;  // "DVICESHP" read little-endian
constexpr size_t kDeviceIdBytes = 64;
constexpr size_t kRecordBytes = 256;  // the record, padded; the slots follow

}  // namespace

// What the owner publishes; immutable once published except ownerClosing.
struct DeviceShare::Record {
  uint64_t magic;
  uint64_t bytes;
  int32_t localWorldSize;
  std::atomic<uint32_t> ownerClosing;  // the owner is waiting for importers to detach
  char deviceId[kDeviceIdBytes];       // NUL-terminated
  uint8_t handle[kIpcHandleBytes];
};

// One per local rank: whether that rank has the memory open, and who it is.
struct alignas(64) DeviceShare::Slot {
  std::atomic<uint32_t> attached;
  std::atomic<int32_t> pid;
  std::atomic<uint64_t> startTicks;
};

size_t DeviceShare::payloadBytes(int localWorldSize) {
  static_assert(sizeof(Record) <= kRecordBytes);
  return kRecordBytes + static_cast<size_t>(std::max(localWorldSize, 1)) * sizeof(Slot);
}

DeviceShare::Record& DeviceShare::record() const { return *static_cast<Record*>(region_.payload()); }

DeviceShare::Slot& DeviceShare::slot(int localRank) const {
  return reinterpret_cast<Slot*>(static_cast<char*>(region_.payload()) + kRecordBytes)[localRank];
}

namespace {

ShmRegion makeRegion(const DeviceShare::Options& o) {
  if (o.localWorldSize < 1 || o.localRank < 0 || o.localRank >= o.localWorldSize || o.bytes == 0) {
    COHORT_THROW(InvalidArgument) << "GPU parameter share needs 0 <= local rank < local world size and a size, got "
                                  << "local rank " << o.localRank << " of " << o.localWorldSize << ", " << o.bytes
                                  << " bytes";
  }
  const size_t payload = DeviceShare::payloadBytes(o.localWorldSize);
  if (o.localRank == 0) {
    return ShmRegion::create({.jobId = o.jobId, .name = o.name, .payloadBytes = payload, .generation = o.generation});
  }
  return ShmRegion::open({.jobId = o.jobId,
                          .name = o.name,
                          .payloadBytes = payload,
                          .generation = o.generation,
                          .timeout = o.timeout,
                          .creatorDescription = "local rank 0 (the owner of the GPU parameters)"});
}

}  // namespace

DeviceShare::DeviceShare(DeviceMemory& memory, const Options& options, const Initializer& initialise)
    : memory_(memory),
      region_(makeRegion(options)),
      localRank_(options.localRank),
      localWorldSize_(options.localWorldSize),
      bytes_(options.bytes),
      timeout_(options.timeout) {
  if (!region_.isCreator()) {
    importFromOwner(options);
    return;
  }
  // The owner: a fresh allocation of its own, initialised before anyone can see it.
  Record& r = *new (region_.payload()) Record{};
  for (int k = 0; k < localWorldSize_; ++k) new (&slot(k)) Slot{};
  data_ = memory_.allocate(bytes_);
  try {
    if (initialise) initialise(data_, bytes_);
    const IpcHandle handle = memory_.exportHandle(data_);
    const std::string id = memory_.deviceId();
    COHORT_CHECK(id.size() < kDeviceIdBytes) << "device id " << id;
    r.magic = kRecordMagic;
    r.bytes = bytes_;
    r.localWorldSize = localWorldSize_;
    std::memcpy(r.deviceId, id.c_str(), id.size() + 1);
    std::memcpy(r.handle, handle.data(), handle.size());
  } catch (...) {
    memory_.release(data_);
    throw;
  }
  slot(0).pid.store(static_cast<int32_t>(::getpid()));
  slot(0).attached.store(1, std::memory_order_release);
  region_.publish();
}

void DeviceShare::importFromOwner(const Options& options) {
  const Record& r = record();
  ownerPid_ = region_.creatorPid();
  ownerStartTicks_ = region_.creatorStartTicks();
  if (r.magic != kRecordMagic || r.localWorldSize != localWorldSize_) {
    COHORT_THROW(IoError) << region_.path() << " is not a GPU parameter share for " << localWorldSize_
                          << " local ranks (local world size " << r.localWorldSize << ")";
  }
  if (ownerPid_ == ::getpid()) {
    COHORT_THROW(InvalidArgument) << "local rank " << localRank_ << " is in the same process (pid " << ownerPid_
                                  << ") as local rank 0, which exported the GPU parameters: CUDA cannot open an IPC "
                                  << "handle in its own process; start one process per rank (cohortrun, mpirun, srun)";
  }
  if (r.bytes != bytes_) {
    COHORT_THROW(InvalidArgument) << "local rank " << localRank_ << " expects " << bytes_
                                  << " bytes of GPU parameters but local rank 0 shares " << r.bytes
                                  << " (do all ranks train the same model?)";
  }
  const std::string ownerDevice(r.deviceId, strnlen(r.deviceId, kDeviceIdBytes));
  const std::string mine = memory_.deviceId();
  if (ownerDevice != mine && !memory_.canAccess(ownerDevice)) {
    COHORT_THROW(InvalidArgument) << "local rank " << localRank_ << " runs on GPU " << mine
                                  << ", which cannot access local rank 0's GPU " << ownerDevice
                                  << " (no peer access): GPU Hogwild needs every worker on the owner's GPU or on one "
                                  << "with peer access to it";
  }
  IpcHandle handle;
  std::memcpy(handle.data(), r.handle, handle.size());
  data_ = memory_.open(handle);
  Slot& s = slot(localRank_);
  s.pid.store(static_cast<int32_t>(::getpid()));
  s.startTicks.store(processStartTicks(::getpid()).value_or(0));
  s.attached.store(1, std::memory_order_release);
  watcher_ = std::thread([this, interval = options.ownerCheckInterval] { watchOwner(interval); });
}

void DeviceShare::watchOwner(std::chrono::milliseconds interval) {
  while (!stopWatching_.load()) {
    if (!processIsAlive(ownerPid_, ownerStartTicks_)) {
      ownerLost_.store(true);
      return;
    }
    // Sleeps in short slices so the destructor never waits a whole interval.
    const auto until = std::chrono::steady_clock::now() + interval;
    while (!stopWatching_.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::min(interval, std::chrono::milliseconds(20)));
    }
  }
}

void DeviceShare::throwIfOwnerLost(std::chrono::milliseconds settle) const {
  if (!region_.isCreator() && settle.count() > 0) {
    const auto deadline = std::chrono::steady_clock::now() + settle;
    while (!ownerLost_.load() && processIsAlive(ownerPid_, ownerStartTicks_) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!processIsAlive(ownerPid_, ownerStartTicks_)) ownerLost_.store(true);
  }
  if (ownerLost_.load(std::memory_order_relaxed)) {
    COHORT_THROW(PeerError) << "local rank 0 (pid " << ownerPid_ << "), which owns the shared GPU parameters, exited "
                            << "while local rank " << localRank_ << " was still using them; the parameters are gone, "
                            << "so this rank stops";
  }
}

void DeviceShare::waitForImporters(std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    bool anyAttached = false;
    for (int k = 1; k < localWorldSize_; ++k) {
      Slot& s = slot(k);
      if (s.attached.load(std::memory_order_acquire) == 0) continue;
      // A rank that died with the memory open has let go of it with its process.
      if (processIsAlive(s.pid.load(), s.startTicks.load())) anyAttached = true;
    }
    if (!anyAttached || std::chrono::steady_clock::now() >= deadline) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // each pass reads /proc: not a spin
  }
}

DeviceShare::~DeviceShare() {
  if (!region_.isCreator()) {
    stopWatching_.store(true);
    if (watcher_.joinable()) watcher_.join();
    if (data_) memory_.close(data_);
    slot(localRank_).attached.store(0, std::memory_order_release);
    return;
  }
  // The owner frees only after every importer has let go (or the timeout has passed: an importer
  // that hangs must not keep the owner, and so the whole job, from ending).
  record().ownerClosing.store(1);
  waitForImporters(timeout_);
  memory_.release(data_);
}

}  // namespace cohort::ipc
