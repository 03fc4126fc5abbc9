// LrSchedule: the learning rate of each optimizer step, as a pure function of the step, so that a
// run resumed from a checkpoint (which holds the optimizer's step count) continues the schedule bit
// for bit. The formulas are PyTorch's (torch.optim.lr_scheduler), stepped once per optimizer step:
//
//   warmup (any kind)  t < W:  lr = base * t / W             linear from 0 (LambdaLR(t / W), the
//                                                            warmup of Hugging Face's schedules)
//   constant           t >= W: lr = base
//   step               t >= W: lr = base * gamma^floor((t - W) / stepSize)                 (StepLR)
//   cosine             t >= W: lr = minLr + (base - minLr) * (1 + cos(pi * (t - W) / (T - W))) / 2
//                              (CosineAnnealingLR with T_max = T - W, eta_min = minLr); minLr from T on
//
// where t counts optimizer steps from 0 (the step about to be taken), W = warmupSteps and T =
// totalSteps. After warmup the pieces follow one another as torch's SequentialLR(milestones=[W]).
// The value is computed in double and returned as the optimizer's float.
// A value type; thread-safe to read.
//
//   nn::LrSchedule schedule({.kind = nn::LrScheduleKind::kCosine, .baseLr = 0.1, .warmupSteps = 100,
//                            .totalSteps = 10000, .minLr = 1e-4});
//   optimizer.setLr(schedule.lrAt(optimizer.steps()));
#pragma once

#include <cstdint>
#include <string>

namespace cohort::nn {

enum class LrScheduleKind { kConstant, kStep, kCosine };
// "constant", "step", "cosine"; InvalidArgument naming the accepted ones otherwise.
LrScheduleKind parseLrScheduleKind(const std::string& name);
const char* toString(LrScheduleKind kind);

struct LrScheduleOptions {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  double baseLr = 0.01;
  int64_t warmupSteps = 0;  // W >= 0
  int64_t totalSteps = 0;   // cosine: T > W, the steps of the whole run
  double minLr = 0;         // cosine: the floor, 0 <= minLr <= baseLr
  int64_t stepSize = 0;     // step: > 0
  double gamma = 0.1;       // step: > 0
};

class LrSchedule {
 public:
  // InvalidArgument naming the option for values the formulas cannot take.
  explicit LrSchedule(const LrScheduleOptions& options);

  // The learning rate of optimizer step `step` (from 0).
  float lrAt(int64_t step) const;
  const LrScheduleOptions& options() const { return options_; }
  // "cosine from 0.1 to 0.0001 over 10000 steps after 100 warmup steps", for logs.
  std::string describe() const;

 private:
  LrScheduleOptions options_;
};

}  // namespace cohort::nn
