#include "train/observe/timeline.h"

namespace cohort::train {

const char* toString(SpanKind kind) {
  switch (kind) {
    case SpanKind::kData:
      return "data";
    case SpanKind::kForward:
      return "forward";
    case SpanKind::kBackward:
      return "backward";
    case SpanKind::kStep:
      return "step";
    case SpanKind::kCommWait:
      return "comm_wait";
    case SpanKind::kReduce:
      return "reduce";
    case SpanKind::kOptimizer:
      return "optimizer";
    case SpanKind::kBarrier:
      return "barrier";
    case SpanKind::kEvaluate:
      return "evaluate";
    case SpanKind::kCheckpoint:
      return "checkpoint";
    case SpanKind::kAllReduce:
      return "allreduce";
  }
  return "?";
}

void Timeline::start(size_t capacity) {
  ring_.assign(capacity, Span{});
  recorded_ = 0;
  totals_ = {};
  origin_ = clockNs();
  active_ = true;
}

std::vector<Span> Timeline::spans() const {
  std::vector<Span> out;
  if (ring_.empty()) return out;
  const uint64_t n = recorded_ < ring_.size() ? recorded_ : ring_.size();
  out.reserve(n);
  for (uint64_t i = recorded_ - n; i < recorded_; ++i) out.push_back(ring_[i % ring_.size()]);
  return out;
}

}  // namespace cohort::train
