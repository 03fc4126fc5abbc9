#include "train/step/step_guard.h"

#include <vector>

#include "nn/grad_norm.h"
#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/gpu_context.h"
#include "runtime/cuda/pinned_allocator.h"
#include "runtime/cuda/step_guard.h"
#endif

namespace cohort::train {

#ifdef COHORT_HAVE_CUDA
namespace {

using runtime::cuda::StepGuardState;
using runtime::cuda::StepRecord;

// The device scratch: the sum's doubles, then the guard's state, then the step's record, then the
// judge's options.
constexpr size_t kSumBytes = runtime::cuda::kSumOfSquaresScratch * sizeof(double);
constexpr size_t kStateOffset = kSumBytes;
constexpr size_t kRecordOffset = kStateOffset + (sizeof(StepGuardState) + 7) / 8 * 8;
constexpr size_t kOptionsOffset = kRecordOffset + (sizeof(StepRecord) + 7) / 8 * 8;
constexpr size_t kScratchBytes = kOptionsOffset + sizeof(runtime::cuda::JudgeOptions);
static_assert(kSumBytes % alignof(StepGuardState) == 0 && kRecordOffset % alignof(StepRecord) == 0 &&
              kOptionsOffset % alignof(runtime::cuda::JudgeOptions) == 0);

template <class T>
T* at(const runtime::Tensor& t, size_t offset) {
  return reinterpret_cast<T*>(reinterpret_cast<char*>(t.data()) + offset);
}

int64_t floatsFor(size_t bytes) { return static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float)); }

}  // namespace
#endif

StepGuard::StepGuard(runtime::cuda::GpuContext* gpu, std::chrono::milliseconds timeout) : gpu_(gpu), timeout_(timeout) {}

StepGuard::~StepGuard() {
  // The stream may still copy into the pinned records: let it finish before they are freed.
  if (pending_.empty()) return;
  try {
    arrived_[pending_.back().slot].synchronize(timeout_);
  } catch (const Error&) {
    // Unwinding from a failed step: the context's stream goes down with the job anyway.
  }
}

double StepGuard::sumOfSquares(const runtime::Tensor& grads) {
#ifdef COHORT_HAVE_CUDA
  if (grads.device().isCuda()) {
    COHORT_CHECK(gpu_) << "gradients on " << grads.device().str() << " without a GPU context";
    runtime::ensureShape(scratch_, runtime::Shape{floatsFor(kScratchBytes)}, gpu_->allocator());
    auto* scratch = at<double>(scratch_, 0);
    runtime::cuda::sumOfSquares({grads.data(), static_cast<size_t>(grads.numel())}, scratch, gpu_->stream());
    double sum = 0;
    runtime::cuda::copyToHost(&sum, scratch, sizeof sum, gpu_->stream());
    gpu_->stream().synchronize(timeout_);
    return sum;
  }
#endif
  return nn::sumOfSquares({grads.data(), static_cast<size_t>(grads.numel())});
}

double StepGuard::sumOfSquares(std::span<const runtime::Tensor> pieces) {
  double sum = 0;
#ifdef COHORT_HAVE_CUDA
  if (!pieces.empty() && pieces.front().device().isCuda()) {
    COHORT_CHECK(gpu_) << "gradients on " << pieces.front().device().str() << " without a GPU context";
    runtime::ensureShape(pieceScratch_, runtime::Shape{floatsFor(pieces.size() * kSumBytes)}, gpu_->allocator());
    constexpr size_t kDoubles = runtime::cuda::kSumOfSquaresScratch;
    for (size_t i = 0; i < pieces.size(); ++i) {
      runtime::cuda::sumOfSquares({pieces[i].data(), static_cast<size_t>(pieces[i].numel())},
                                  at<double>(pieceScratch_, i * kSumBytes), gpu_->stream());
    }
    std::vector<double> sums(pieces.size() * kDoubles);
    runtime::cuda::copyToHost(sums.data(), pieceScratch_.data(), pieces.size() * kSumBytes, gpu_->stream());
    gpu_->stream().synchronize(timeout_);
    for (size_t i = 0; i < pieces.size(); ++i) sum += sums[i * kDoubles];
    return sum;
  }
#endif
  for (const runtime::Tensor& piece : pieces) {
    sum += nn::sumOfSquares({piece.data(), static_cast<size_t>(piece.numel())});
  }
  return sum;
}

const runtime::cuda::StepControl* StepGuard::judge(const runtime::Tensor& grads, const Judge& j) {
  stageJudge(j);
  const runtime::cuda::StepControl* control = judgeOnDevice(grads);
  sendRecord();
  return control;
}

void StepGuard::stageJudge(const Judge& j) {
#ifdef COHORT_HAVE_CUDA
  COHORT_CHECK(gpu_) << "a deferred step judges a GPU gradient";
  COHORT_CHECK(!staged_) << "a step staged twice without its record sent";
  COHORT_CHECK(pending_.size() < kMaxPending) << pending_.size() << " steps judged and not settled";
  if (!records_.defined()) {
    runtime::ensureShape(scratch_, runtime::Shape{floatsFor(kScratchBytes)}, gpu_->allocator());
    pinned_ = std::make_unique<runtime::cuda::PinnedHostAllocator>();
    records_ = runtime::Tensor::empty(runtime::Shape{floatsFor(kMaxPending * sizeof(StepRecord))}, *pinned_);
  }
  const bool seed = pending_.empty();
  if (seed) settledNonFinite_ = 0;
  runtime::cuda::storeOnDevice(at<runtime::cuda::JudgeOptions>(scratch_, kOptionsOffset),
                               {.gradScale = j.gradScale,
                                .clipGradNorm = j.clipGradNorm,
                                .lossNonFinite = j.loss.nonFiniteRank >= 0 ? 1 : 0,
                                .lossSpike = j.loss.spikeRank >= 0 ? 1 : 0,
                                .maxGradNorm = j.maxGradNorm,
                                .nonFiniteLimit = settledNonFinite_ + j.skipsLeft,
                                .seed = seed ? 1 : 0,
                                .seedApplied = j.settledSteps},
                               gpu_->stream());
  pending_.push_back({.slot = next_, .loss = j.loss, .gradientRank = j.gradientRank, .maxGradNorm = j.maxGradNorm});
  next_ = (next_ + 1) % kMaxPending;
  staged_ = true;
#else
  (void)j;
  COHORT_CHECK(false) << "a deferred GPU step without CUDA";
#endif
}

const runtime::cuda::StepControl* StepGuard::judgeOnDevice(const runtime::Tensor& grads) {
#ifdef COHORT_HAVE_CUDA
  // Its memory exists from the first stageJudge on (a graph captures it before the step's stageJudge).
  COHORT_CHECK(records_.defined() && grads.device().isCuda()) << "a GPU gradient judged before any step was staged";
  const runtime::Stream& stream = gpu_->stream();
  auto* sum = at<double>(scratch_, 0);
  auto* state = at<StepGuardState>(scratch_, kStateOffset);
  runtime::cuda::sumOfSquares({grads.data(), static_cast<size_t>(grads.numel())}, sum, stream);
  runtime::cuda::judgeStep(sum, at<runtime::cuda::JudgeOptions>(scratch_, kOptionsOffset), state,
                           at<StepRecord>(scratch_, kRecordOffset), stream);
  return &state->control;
#else
  (void)grads;
  return nullptr;
#endif
}

void StepGuard::sendRecord() {
#ifdef COHORT_HAVE_CUDA
  COHORT_CHECK(staged_) << "a step's record sent before the step was staged";
  // Stream order makes the one device record safe to reuse: this copy runs before the next judge.
  const size_t slot = pending_.back().slot;
  runtime::cuda::copyToHost(reinterpret_cast<StepRecord*>(records_.data()) + slot, at<StepRecord>(scratch_, kRecordOffset),
                            sizeof(StepRecord), gpu_->stream());
  arrived_[slot].record(gpu_->stream());
  staged_ = false;
#endif
}

StepGuard::Settled StepGuard::settle() {
  COHORT_CHECK(!pending_.empty()) << "no judged step to settle";
#ifdef COHORT_HAVE_CUDA
  const Pending p = pending_.front();
  arrived_[p.slot].synchronize(timeout_);
  pending_.pop_front();
  const StepRecord r = reinterpret_cast<const StepRecord*>(records_.data())[p.slot];
  settledNonFinite_ = r.nonFiniteSteps;
  Settled s;
  s.result.gradNorm = r.gradNorm;
  s.result.applied = r.applied != 0;
  s.result.halted = r.halted != 0;
  if (r.nonFinite == 1) {
    s.result.nonFinite = NonFinite::kLoss;
    s.result.rank = p.loss.nonFiniteRank;
  } else if (r.nonFinite == 2) {
    s.result.nonFinite = NonFinite::kGradient;
    s.result.rank = p.gradientRank;
  } else if (r.spike == 1) {
    s.result.spike = Spike::kLoss;
    s.result.rank = p.loss.spikeRank;
  } else if (r.spike == 2) {
    s.result.spike = Spike::kGradient;
    s.result.rank = p.gradientRank;
    s.result.gradNormLimit = p.maxGradNorm;
  }
  s.appliedSteps = r.appliedSteps;
  s.appliedBefore = r.appliedSteps - r.applied;
  return s;
#else
  return {};
#endif
}

}  // namespace cohort::train
