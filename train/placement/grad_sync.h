// GradSync: averages gradients across the ranks of a job with bucketed all-reduce, overlapped with
// backward (docs/architecture.md, "The decisions that shape everything", item 1; Flashlight's
// reducer shape: afterBackward() per unit, then finish()).
//
// Buckets are contiguous slices of the flat gradient buffer, formed once from the ParamBuffer's
// entries in reverse order (backward produces the last layer's gradients first): the first bucket
// holds up to `firstBucketBytes`, the others up to `bucketBytes`; a bucket never splits a module's
// parameters (entries named "<module>.<param>"), and one module larger than the cap is a bucket of
// its own. GradSync is the pass's nn::UnitListener (nn/module.h, "Units"): during backward the
// model tells afterBackward(unit) as each parameter unit's gradients become final, in reverse unit
// order, which is the buckets' order; when every entry of a bucket is final, its all-reduce
// (average) starts at once, in place, on the communicator's progress thread, while backward goes
// on. A bucket may hold parts of two units (it is cut at modules, as before units existed, so that
// the all-reduces and their results stay the same); it starts when the earlier unit is done. On a
// GPU (NCCL with the compute stream) each all-reduce is ordered after the backward kernels enqueued
// before it by an event, so the host reports a unit as soon as it has enqueued its backward.
// finish() waits for every bucket
// (bounded by the timeout) and readies the next step. All ranks build the same buckets from the same
// model and issue them in the same order, which the communicator's fingerprints check.
// broadcastParams() makes every replica start from rank 0's parameters.
// With the job's timeline active (train/observe/timeline.h), each bucket's all-reduce is a span from its
// issue to the moment the training thread sees it done: it looks at the started buckets each time
// backward reports a unit, and waits for the rest in finish(); the step's all-reduce (bytes, first
// issue to last done) goes into the timeline's totals for the bus bandwidth.
// Ownership: borrows the communicator and the ParamBuffer, which must outlive it.
// Thread safety: the training thread only.
#pragma once

#include <chrono>
#include <vector>

#include "collectives/communicator.h"
#include "nn/module.h"
#include "nn/param_buffer.h"
#include "train/observe/timeline.h"

namespace cohort::train {

struct GradSyncOptions {
  size_t bucketBytes = size_t{25} << 20;
  size_t firstBucketBytes = size_t{1} << 20;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  Timeline* timeline = nullptr;  // spans of the bucket all-reduces when active
};

class GradSync final : public nn::UnitListener {
 public:
  GradSync(collectives::Communicator& comm, const nn::ParamBuffer& params, const GradSyncOptions& options);

  void broadcastParams();
  // The unit's entries are final: starts every bucket whose entries all are. A unit reported twice
  // in one step is a broken model (COHORT_CHECK).
  void afterBackward(const nn::ParamBuffer::Unit& unit) override;
  // Starts whatever has not started (units nobody reported) and waits for every bucket.
  void finish();

  struct Bucket {
    size_t firstEntry = 0, endEntry = 0;  // entries [first, end)
    size_t offset = 0, count = 0;         // slice of the flat buffer, in elements
  };
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Bucket all-reduces issued so far (a step with all buckets issues buckets().size()).
  uint64_t allReducesIssued() const { return issued_; }

 private:
  void start(size_t bucket);
  // Timeline: records the bucket's span when its all-reduce is seen done.
  void noteDone(size_t bucket, int64_t now);
  void lookForDoneBuckets();

  collectives::Communicator& comm_;
  const nn::ParamBuffer& params_;
  GradSyncOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucketOfEntry_;
  std::vector<size_t> pending_;  // entries not yet ready, per bucket
  std::vector<collectives::WorkPtr> work_;
  uint64_t issued_ = 0;
  std::vector<int64_t> issuedAt_;  // timeline: when each bucket's all-reduce was issued; -1 once seen done
  int64_t firstIssued_ = -1, lastDone_ = 0;
};

}  // namespace cohort::train
