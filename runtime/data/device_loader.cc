#include "runtime/data/device_loader.h"

#include <cstring>

#include "runtime/error.h"

namespace cohort::runtime::data {

DeviceLoader::DeviceLoader(DataLoader& host, cuda::GpuContext& gpu, DeviceLoaderOptions options)
    : host_(host), gpu_(gpu), options_(options),
      copyStream_(gpu.device(), StreamOptions{.name = "copy", .priority = -1}) {
  if (options.depth < 1) COHORT_THROW(InvalidArgument) << "DeviceLoader depth must be >= 1, got " << options.depth;
  // Slot shapes come from the host loader's first batch; allocate lazily in issueCopy().
  slots_.resize(static_cast<size_t>(options.depth) + 1);
}

DeviceLoader::~DeviceLoader() {
  // Copies still in flight read pinned buffers and write device buffers this object frees: wait.
  try {
    copyStream_.synchronize(options_.timeout);
    gpu_.stream().synchronize(options_.timeout);
  } catch (...) {
    // A destructor must not throw; the process is failing already if the streams are stuck.
  }
}

void DeviceLoader::startEpoch(int64_t epoch, int64_t firstBatch) {
  releaseCurrent();
  host_.startEpoch(epoch, firstBatch);
  issued_ = returned_ = 0;
  hostDone_ = false;
}

void DeviceLoader::startEpochAfter(int64_t epoch, int64_t samplesSeen) {
  releaseCurrent();
  host_.startEpochAfter(epoch, samplesSeen);
  issued_ = returned_ = 0;
  hostDone_ = false;
}

void DeviceLoader::harvestTiming(Slot& slot) {
  if (!slot.timingPending || !slot.waitEnd.query()) return;
  waitMs_ += slot.waitStart.elapsedMs(slot.waitEnd);
  slot.timingPending = false;
}

double DeviceLoader::inputWaitMs() {
  for (Slot& s : slots_) harvestTiming(s);
  return waitMs_;
}

bool DeviceLoader::issueCopy() {
  if (hostDone_) return false;
  Batch hb;
  if (!host_.next(hb)) {
    hostDone_ = true;
    return false;
  }
  Slot& slot = slots_[static_cast<size_t>(issued_) % slots_.size()];
  // The pinned buffer may still be read by this slot's previous copy.
  slot.copied.synchronize(options_.timeout);
  harvestTiming(slot);
  const size_t inBytes = hb.inputs.bytes(), tgtBytes = hb.targets.bytes();
  if (!slot.inputs.defined() || slot.inputs.capacityBytes() < inBytes || slot.targets.capacityBytes() < tgtBytes) {
    // First use (or a larger batch): the device buffers of a slot are only replaced when the compute
    // stream is done with them.
    slot.consumed.synchronize(options_.timeout);
    slot.stagedInputs = Tensor::empty(hb.inputs.shape(), pinned_);
    slot.stagedTargets = Tensor::empty(hb.targets.shape(), pinned_);
    slot.inputs = Tensor::empty(hb.inputs.shape(), gpu_.allocator());
    slot.targets = Tensor::empty(hb.targets.shape(), gpu_.allocator());
  }
  slot.stagedInputs = slot.stagedInputs.resizedWithin(hb.inputs.shape());
  slot.stagedTargets = slot.stagedTargets.resizedWithin(hb.targets.shape());
  slot.inputs = slot.inputs.resizedWithin(hb.inputs.shape());
  slot.targets = slot.targets.resizedWithin(hb.targets.shape());
  std::memcpy(slot.stagedInputs.data(), hb.inputs.data(), inBytes);
  std::memcpy(slot.stagedTargets.data(), hb.targets.data(), tgtBytes);
  slot.index = hb.index;
  slot.size = hb.size;
  // The device buffer is overwritten only after the compute stream has finished with its last batch.
  copyStream_.waitEvent(slot.consumed);
  cuda::copyToDevice(slot.inputs.data(), slot.stagedInputs.data(), inBytes, copyStream_);
  cuda::copyToDevice(slot.targets.data(), slot.stagedTargets.data(), tgtBytes, copyStream_);
  slot.copied.record(copyStream_);
  ++issued_;
  return true;
}

void DeviceLoader::releaseCurrent() {
  if (!holding_) return;
  Slot& slot = slots_[static_cast<size_t>(returned_ - 1) % slots_.size()];
  slot.consumed.record(gpu_.stream());
  holding_ = false;
}

bool DeviceLoader::next(Batch& batch) {
  releaseCurrent();
  // Keep `depth` copies ahead of the consumer.
  while (issued_ < returned_ + static_cast<int64_t>(slots_.size()) - 1 && issueCopy()) {
  }
  if (returned_ == issued_) return false;
  Slot& slot = slots_[static_cast<size_t>(returned_) % slots_.size()];
  harvestTiming(slot);
  slot.waitStart.record(gpu_.stream());
  gpu_.stream().waitEvent(slot.copied);
  slot.waitEnd.record(gpu_.stream());
  slot.timingPending = true;
  batch.inputs = slot.inputs;
  batch.targets = slot.targets;
  batch.index = slot.index;
  batch.size = slot.size;
  ++returned_;
  holding_ = true;
  return true;
}

}  // namespace cohort::runtime::data
