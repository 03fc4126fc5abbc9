#include "nn/lr_schedule.h"

#include <cmath>
#include <numbers>
#include <sstream>

#include "runtime/error.h"

namespace cohort::nn {

LrScheduleKind parseLrScheduleKind(const std::string& name) {
  if (name == "constant") return LrScheduleKind::kConstant;
  if (name == "step") return LrScheduleKind::kStep;
  if (name == "cosine") return LrScheduleKind::kCosine;
  COHORT_THROW(InvalidArgument) << "unknown learning-rate schedule '" << name << "': expected constant, step or cosine";
}

const char* toString(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kConstant:
      return "constant";
    case LrScheduleKind::kStep:
      return "step";
    case LrScheduleKind::kCosine:
      return "cosine";
  }
  return "?";
}

LrSchedule::LrSchedule(const LrScheduleOptions& o) : options_(o) {
  if (!(o.baseLr > 0) || !std::isfinite(o.baseLr)) COHORT_THROW(InvalidArgument) << "--lr must be positive, got " << o.baseLr;
  if (o.warmupSteps < 0) COHORT_THROW(InvalidArgument) << "--warmup-steps must be >= 0, got " << o.warmupSteps;
  if (o.kind == LrScheduleKind::kCosine) {
    if (o.totalSteps <= o.warmupSteps) {
      COHORT_THROW(InvalidArgument) << "a cosine schedule needs more steps (" << o.totalSteps
                                    << " in this run) than --warmup-steps (" << o.warmupSteps << ")";
    }
    if (!(o.minLr >= 0 && o.minLr <= o.baseLr)) {
      COHORT_THROW(InvalidArgument) << "--min-lr must be between 0 and --lr (" << o.baseLr << "), got " << o.minLr;
    }
  }
  if (o.kind == LrScheduleKind::kStep) {
    if (o.stepSize <= 0) COHORT_THROW(InvalidArgument) << "a step schedule needs --step-size > 0, got " << o.stepSize;
    if (!(o.gamma > 0) || !std::isfinite(o.gamma)) COHORT_THROW(InvalidArgument) << "--gamma must be positive, got " << o.gamma;
  }
}

float LrSchedule::lrAt(int64_t step) const {
  const LrScheduleOptions& o = options_;
  if (step < o.warmupSteps) return static_cast<float>(o.baseLr * static_cast<double>(step) / static_cast<double>(o.warmupSteps));
  const int64_t t = step - o.warmupSteps;
  switch (o.kind) {
    case LrScheduleKind::kConstant:
      return static_cast<float>(o.baseLr);
    case LrScheduleKind::kStep:
      return static_cast<float>(o.baseLr * std::pow(o.gamma, static_cast<double>(t / o.stepSize)));
    case LrScheduleKind::kCosine: {
      const int64_t span = o.totalSteps - o.warmupSteps;
      if (t >= span) return static_cast<float>(o.minLr);
      const double c = std::cos(std::numbers::pi * static_cast<double>(t) / static_cast<double>(span));
      return static_cast<float>(o.minLr + (o.baseLr - o.minLr) * (1.0 + c) / 2.0);
    }
  }
  return static_cast<float>(o.baseLr);
}

std::string LrSchedule::describe() const {
  const LrScheduleOptions& o = options_;
  std::ostringstream os;
  switch (o.kind) {
    case LrScheduleKind::kConstant:
      os << "constant " << o.baseLr;
      break;
    case LrScheduleKind::kStep:
      os << "step from " << o.baseLr << ", x" << o.gamma << " every " << o.stepSize << " steps";
      break;
    case LrScheduleKind::kCosine:
      os << "cosine from " << o.baseLr << " to " << o.minLr << " by step " << o.totalSteps;
      break;
  }
  if (o.warmupSteps > 0) os << " after " << o.warmupSteps << " linear warmup steps from 0";
  return os.str();
}

}  // namespace cohort::nn
