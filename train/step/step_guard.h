// StepGuard: measures the gradient a step is about to apply and, on a GPU, decides the step on the
// device so that the host never waits inside it (issue 31, "no host synchronisation inside a step").
//
// Two ways to use it (internal to train/: the step pipeline and the placements):
//   sumOfSquares(grads)  the gradient's Σ g² for a step the host judges itself (judgeStep,
//                        train/step/step_pipeline.h): on the CPU, or on a GPU waiting for the stream.
//   judge(grads, j)      GPU: enqueues Σ g², the judge kernel (runtime/cuda/step_guard.h) and an
//                        asynchronous copy of the step's record into pinned host memory, and returns
//                        the device StepControl the optimizer's deferred step reads. No host wait.
//   settle()             the oldest judged step's outcome, waiting (at most the timeout) for its
//                        record only: the steps queued after it keep running.
// The judge kernel counts non-finite steps: the first that exceeds the skips allowed halts the
// guard, and a halted guard applies nothing more, so a step queued before the host saw the halt is
// not applied either. Every count restarts from the host's (seed) at the first judge() after
// every record was settled: a loaded checkpoint's step count, a cleared halt.
// Ownership: owns its device scratch, pinned records and events (on the job's GPU context).
// Thread safety: the training thread only; every call enqueues on the context's compute stream.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <span>

#include "runtime/allocator.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"
#include "train/step.h"

namespace cohort::runtime::cuda {
class GpuContext;
struct StepControl;
struct StepRecord;
}  // namespace cohort::runtime::cuda

namespace cohort::train {

// This rank's verdict on its own loss (Job::step).
struct OwnLoss {
  bool finite = true;
  bool spike = false;  // finite, and above the spike rule's limit
};

// What the ranks that step together learn of their losses: the lowest rank whose loss is non-finite
// and the lowest whose loss spiked (-1: none). A rank's vote is one float, reduced by max across the
// ranks: 2W - rank for a non-finite loss, W - rank for a spike, 0 for neither (W ranks), so a
// non-finite loss outranks a spike and a lower rank a higher one; exact in float below 2^23 ranks.
struct LossVerdict {
  int nonFiniteRank = -1;
  int spikeRank = -1;
  static LossVerdict own(OwnLoss loss, int rank);
  static float vote(OwnLoss loss, int rank, int worldSize);
  static LossVerdict ofVotes(float maxVote, int worldSize);
};

class StepGuard {
 public:
  // Records at most this many judged steps before one is settled (Job::step keeps two at most).
  static constexpr size_t kMaxPending = 4;

  StepGuard(runtime::cuda::GpuContext* gpu, std::chrono::milliseconds timeout);
  ~StepGuard();
  StepGuard(const StepGuard&) = delete;
  StepGuard& operator=(const StepGuard&) = delete;

  // Σ g² of a whole flat gradient (nn::sumOfSquares): on the CPU, or on the GPU, waiting.
  double sumOfSquares(const runtime::Tensor& grads);
  // Σ g² of a gradient held in pieces (a ZeRO shard's, train/placement/sharded_placement.h): each
  // piece summed as sumOfSquares sums a whole gradient, the sums added in piece order in double. On
  // the GPU every piece's sum is enqueued and all are read back in one copy and one wait.
  double sumOfSquares(std::span<const runtime::Tensor> pieces);

  struct Judge {
    float gradScale = 1;     // the norm and the update take the gradient times this
    float clipGradNorm = 0;  // StepOptions::clipGradNorm
    LossVerdict loss;
    int gradientRank = -1;   // StepResult::rank of a non-finite gradient or a gradient spike
    double maxGradNorm = std::numeric_limits<double>::infinity();  // the spike rule's (StepPlan)
    int64_t skipsLeft = 0;   // non-finite steps still allowed after the settled ones
    int64_t settledSteps = 0;  // the optimizer's settled step count (the seed)
  };
  // GPU only: judges the step on the device (see the header comment). The control stays valid
  // until the next judge(). judge() is stageJudge, judgeOnDevice and sendRecord in that order.
  const runtime::cuda::StepControl* judge(const runtime::Tensor& grads, const Judge& j);
  // judge() in three parts, for a step whose device work a CUDA graph captures (train/step_graph.h):
  //   stageJudge     the host's part (the ring slot, the seed) and one kernel writing the judge's
  //                  options into device memory: enqueued before the graph's launch, never captured;
  //   judgeOnDevice  Σ g² and the judge kernel, reading those options through a pointer that never
  //                  changes: capturable; returns the StepControl (an address that never changes);
  //   sendRecord     the record's copy into its pinned ring slot and the slot's event: after the
  //                  graph's launch, never captured (the slot changes every step).
  void stageJudge(const Judge& j);
  const runtime::cuda::StepControl* judgeOnDevice(const runtime::Tensor& grads);
  void sendRecord();

  struct Settled {
    StepResult result;
    int64_t appliedSteps = 0;   // the optimizer's step count after this step
    int64_t appliedBefore = 0;  // and before it
  };
  size_t pending() const { return pending_.size(); }
  // The oldest pending step's outcome; a CHECK fails when none is pending. TimeoutError when its
  // record has not arrived within the timeout.
  Settled settle();

 private:
  struct Pending {
    size_t slot = 0;
    LossVerdict loss;
    int gradientRank = -1;
    double maxGradNorm = 0;
  };
  runtime::cuda::GpuContext* gpu_;
  std::chrono::milliseconds timeout_;
  runtime::Tensor scratch_;  // GPU: the sum's partials, then the guard's state and its record
  runtime::Tensor pieceScratch_;  // GPU: each piece's sum and partials (sumOfSquares of pieces)
  std::unique_ptr<runtime::Allocator> pinned_;  // GPU: page-locked host memory
  runtime::Tensor records_;  // GPU: a ring of kMaxPending StepRecords in pinned_ (declared after it)
  std::array<runtime::Event, kMaxPending> arrived_;  // one per ring slot: its record is on the host
  std::deque<Pending> pending_;
  size_t next_ = 0;              // the ring slot of the next judged step
  bool staged_ = false;          // stageJudge ran and sendRecord has not
  int64_t settledNonFinite_ = 0;  // the device's non-finite count as of the last settled record
};

}  // namespace cohort::train
