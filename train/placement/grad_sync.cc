#include "train/placement/grad_sync.h"

#include <algorithm>
#include <string>

#include "runtime/error.h"

namespace cohort::train {

namespace {

// The module an entry belongs to: its name up to the last '.' ("fc0.weight" -> "fc0").
std::string moduleOf(const std::string& name) {
  size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

}  // namespace

GradSync::GradSync(collectives::Communicator& comm, const nn::ParamBuffer& params, const GradSyncOptions& options)
    : comm_(comm), params_(params), options_(options) {
  const auto& entries = params.entries();
  bucketOfEntry_.assign(entries.size(), 0);
  // Walk the modules from the last to the first (the order backward finishes them), closing a bucket
  // when the next module would push it past its cap. A module's parameters become final together,
  // so a bucket never splits one. The slice of a bucket runs from its lowest entry's offset to the
  // end of its highest entry (padding between entries included, so slices tile the buffer).
  size_t cap = options.firstBucketBytes;
  size_t end = entries.size();
  while (end > 0) {
    size_t first = end - 1;
    while (first > 0 && moduleOf(entries[first - 1].name) == moduleOf(entries[end - 1].name)) --first;
    const size_t sliceEnd = entries[end - 1].offset + entries[end - 1].numel;
    const size_t moduleBytes = (sliceEnd - entries[first].offset) * sizeof(float);
    if (buckets_.empty() || (buckets_.back().count * sizeof(float) + moduleBytes > cap)) {
      if (!buckets_.empty()) cap = options.bucketBytes;
      buckets_.push_back({first, end, entries[first].offset, 0});
    }
    Bucket& b = buckets_.back();
    const size_t bucketEnd = b.count == 0 ? sliceEnd : b.offset + b.count;
    b.firstEntry = first;
    b.offset = entries[first].offset;
    b.count = bucketEnd - b.offset;
    for (size_t i = first; i < end; ++i) bucketOfEntry_[i] = buckets_.size() - 1;
    end = first;
  }
  pending_.resize(buckets_.size());
  work_.resize(buckets_.size());
  issuedAt_.assign(buckets_.size(), -1);
  for (size_t b = 0; b < buckets_.size(); ++b) pending_[b] = buckets_[b].endEntry - buckets_[b].firstEntry;
}

void GradSync::broadcastParams() {
  comm_.broadcast(params_.values().data(), params_.numel(), 0)->wait(options_.timeout);
}

void GradSync::afterBackward(const nn::ParamBuffer::Unit& unit) {
  if (options_.timeline && options_.timeline->active()) lookForDoneBuckets();
  // From the last entry down: of two buckets a unit completes, the later one's (lower index) starts
  // first, so buckets start in index order, as finish() starts those nobody reported.
  for (size_t i = unit.endEntry; i-- > unit.firstEntry;) {
    size_t b = bucketOfEntry_.at(i);
    COHORT_CHECK(pending_[b] > 0) << "gradient of entry " << i << " (unit " << unit.name
                                  << ") reported twice in one step";
    if (--pending_[b] == 0) start(b);
  }
}

void GradSync::start(size_t b) {
  float* slice = params_.grads().data() + buckets_[b].offset;
  work_[b] = comm_.allReduce(slice, slice, buckets_[b].count, {.op = collectives::ReduceOp::kAvg});
  ++issued_;
  if (options_.timeline && options_.timeline->active()) {
    issuedAt_[b] = options_.timeline->now();
    if (firstIssued_ < 0) firstIssued_ = issuedAt_[b];
  }
}

void GradSync::noteDone(size_t b, int64_t now) {
  if (issuedAt_[b] < 0) return;
  options_.timeline->record(SpanKind::kAllReduce, issuedAt_[b], now, static_cast<uint16_t>(b));
  issuedAt_[b] = -1;
  lastDone_ = std::max(lastDone_, now);
}

void GradSync::lookForDoneBuckets() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (work_[b] && issuedAt_[b] >= 0 && work_[b]->done()) noteDone(b, options_.timeline->now());
  }
}

void GradSync::finish() {
  // Every rank starts any bucket nobody reported in the same (bucket) order, so the order of
  // collectives stays identical across ranks.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!work_[b]) start(b);
  }
  Timeline* timeline = options_.timeline && options_.timeline->active() ? options_.timeline : nullptr;
  if (timeline) lookForDoneBuckets();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    work_[b]->wait(options_.timeout);
    if (timeline) noteDone(b, timeline->now());
    work_[b].reset();
    pending_[b] = buckets_[b].endEntry - buckets_[b].firstEntry;
  }
  if (timeline) {
    timeline->addAllReduce(static_cast<double>(params_.numel() * sizeof(float)), lastDone_ - firstIssued_);
    firstIssued_ = -1;
    lastDone_ = 0;
  }
}

}  // namespace cohort::train
