// Timeline: where one rank's training time goes — spans of data wait, forward, backward, the step
// (gradient synchronisation and optimizer), each gradient bucket's all-reduce, barriers, evaluation
// and checkpoints — kept for the job's trace (--trace, train/observe/trace_file.h) and summed for the
// epoch's time report (--step-report, train/observe/step_times.h).
//
// Off by default, and then recording is one predictable branch (`active()` is false): nothing is
// read from the clock and nothing is written. Started with a ring of `capacity` spans, allocated
// once by start(): recording a span writes 24 bytes into the ring (the oldest spans are overwritten
// when it is full) and adds its length to the epoch's total of its kind; nothing is allocated.
// With capacity 0 only the totals are kept (the time report without a trace).
//
// Times are nanoseconds of CLOCK_MONOTONIC (steady_clock) since the timeline's origin, this
// process's clock: the trace maps them onto rank 0's clock with offsets measured at start-up.
//
// Two lanes: the training thread's spans nest (a step holds its barriers and its optimizer); the
// bucket all-reduces, which run beside backward, lie on a lane of their own (SpanKind::kAllReduce).
// Ownership: owns its ring. Thread safety: the training thread only (bucket spans are recorded by
// the training thread when it sees a bucket done).
//
//   timeline.start(1 << 14);
//   { Timeline::Scope s(timeline, SpanKind::kForward); model.forward(...); }
//   timeline.record(SpanKind::kAllReduce, issuedNs, Timeline::now(), bucket);
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <vector>

namespace cohort::train {

enum class SpanKind : uint8_t {
  kData,        // waiting for the next batch from the loader
  kForward,     // forward and loss
  kBackward,    // backward (the bucket all-reduces start inside it)
  kStep,        // Job::step: synchronisation, norm and optimizer (holds the next four)
  kCommWait,    // inside a step: waiting for the gradient all-reduces still running (not hidden by backward)
  kReduce,      // inside a step: averaging this rank's slice of the gradient (the shm shared copy)
  kOptimizer,   // inside a step: the gradient's norm, clipping and the optimizer's update
  kBarrier,     // waiting at a barrier for the other ranks
  kEvaluate,    // evaluation on the test set (rank 0)
  kCheckpoint,  // writing or reading a checkpoint
  kAllReduce,   // one gradient bucket's all-reduce, issued -> seen done (its own lane)
};
inline constexpr size_t kSpanKinds = 11;
// "data", "forward", "backward", "step", "comm_wait", "reduce", "optimizer", "barrier", "evaluate",
// "checkpoint", "allreduce".
const char* toString(SpanKind kind);

struct Span {
  int64_t start = 0;  // ns since the origin
  int64_t end = 0;
  int32_t step = 0;   // the optimizer step it belongs to (steps done before it + 1)
  uint16_t aux = 0;   // kAllReduce: the bucket
  SpanKind kind = SpanKind::kData;
};

class Timeline {
 public:
  // ns of CLOCK_MONOTONIC (the same clock on every process of a node).
  static int64_t clockNs() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
  }

  // Starts recording (the origin is now): a ring of `capacity` spans (0: the totals only).
  void start(size_t capacity);
  bool active() const { return active_; }
  bool tracing() const { return !ring_.empty(); }
  // ns since the origin (only meaningful when active).
  int64_t now() const { return clockNs() - origin_; }
  int64_t originClockNs() const { return origin_; }
  void setStep(int64_t step) { step_ = static_cast<int32_t>(step); }

  void record(SpanKind kind, int64_t start, int64_t end, uint16_t aux = 0) {
    if (!active_) return;
    totals_.ns[static_cast<size_t>(kind)] += end - start;
    if (ring_.empty()) return;
    ring_[recorded_ % ring_.size()] = {start, end, step_, aux, kind};
    ++recorded_;
  }
  // A step's gradient all-reduce: `bytes` over the ranks in `ns` (first bucket issued -> last done).
  void addAllReduce(double bytes, int64_t ns) {
    if (!active_) return;
    totals_.allReduceBytes += bytes;
    totals_.allReduceNs += ns;
  }
  void addStep() {
    if (active_) ++totals_.steps;
  }

  // Records the span from construction to destruction (nothing when inactive).
  class Scope {
   public:
    Scope(Timeline& t, SpanKind kind, uint16_t aux = 0) : t_(t), kind_(kind), aux_(aux), start_(t.active() ? t.now() : 0) {}
    ~Scope() {
      if (t_.active()) t_.record(kind_, start_, t_.now(), aux_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Timeline& t_;
    SpanKind kind_;
    uint16_t aux_;
    int64_t start_;
  };

  // What the spans of each kind add up to since the last takeTotals().
  struct Totals {
    std::array<int64_t, kSpanKinds> ns{};
    int64_t steps = 0;
    double allReduceBytes = 0;
    int64_t allReduceNs = 0;
  };
  Totals takeTotals() {
    Totals t = totals_;
    totals_ = {};
    return t;
  }

  // The spans still in the ring, oldest first, and how many were overwritten.
  std::vector<Span> spans() const;
  uint64_t dropped() const { return recorded_ > ring_.size() ? recorded_ - ring_.size() : 0; }

  // The clock rounds of the start-up measurement (train/observe/trace_file.h): this rank's clock just after
  // a collective that rank 0 entered at its `sent`, and just before one rank 0 left at its `back`.
  struct ClockRound {
    int64_t sent = 0, received = 0, replied = 0, back = 0;  // ns since the origin
  };
  std::vector<ClockRound>& clockRounds() { return clockRounds_; }
  const std::vector<ClockRound>& clockRounds() const { return clockRounds_; }

 private:
  bool active_ = false;
  int64_t origin_ = 0;
  int32_t step_ = 0;
  std::vector<Span> ring_;
  uint64_t recorded_ = 0;
  Totals totals_;
  std::vector<ClockRound> clockRounds_;
};

}  // namespace cohort::train
