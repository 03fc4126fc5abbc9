// nn::LrSchedule against PyTorch 1.13 (Debian's python3-torch), step by step. The expectations were
// printed by this program (base 0.1, W = 5 warmup steps, cosine T = 40 and eta_min 0.001, StepLR
// step_size 7 and gamma 0.5; the learning rate read before each optimizer step):
//
//   import torch
//   def run(kind, base=0.1, W=5, T=40, min_lr=0.001, step_size=7, gamma=0.5, steps=45):
//       opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
//       warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: t / W)
//       after = {"cosine": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=T - W, eta_min=min_lr),
//                "step": lambda: torch.optim.lr_scheduler.StepLR(opt, step_size=step_size, gamma=gamma),
//                "constant": lambda: torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0, total_iters=0)}[kind]()
//       sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, after], milestones=[W])
//       out = []
//       for t in range(steps):
//           out.append(opt.param_groups[0]["lr"]); opt.step(); sched.step()
//       return out
//
// (cosine compared up to step T: PyTorch's CosineAnnealingLR rises again after T_max, Cohort's
// schedule keeps the floor.)
#include "nn/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "runtime/error.h"

namespace cohort::nn {
namespace {

const std::vector<double> kTorchCosine = {0.0, 0.020000000000000004, 0.04000000000000001, 0.06, 0.08000000000000002, 0.1, 0.09980072755276434, 0.09920451463563217, 0.09821616160444474, 0.096843626096667, 0.09509795896116975, 0.09299321528329238, 0.09054634122155991, 0.08777703756717876, 0.08470760112484982, 0.08136274519200733, 0.07776940058187909, 0.07395649879241345, 0.06995473906686923, 0.0657963412215599, 0.061514786230837566, 0.05714454665797396, 0.052720809102350503, 0.048279190897649524, 0.04385545334202606, 0.03948521376916245, 0.03520365877844011, 0.0310452609331308, 0.027043501207586574, 0.023230599418120935, 0.019637254807992697, 0.016292398875150202, 0.013222962432821263, 0.010453658778440105, 0.008006784716707627, 0.005902041038830257, 0.004156373903333008, 0.002783838395555264, 0.0017954853643678314, 0.0011992724472356662, 0.001};
const std::vector<double> kTorchStep = {0.0, 0.020000000000000004, 0.04000000000000001, 0.06, 0.08000000000000002, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.025, 0.025, 0.025, 0.025, 0.0125, 0.0125, 0.0125, 0.0125, 0.0125, 0.0125, 0.0125, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.00625, 0.003125, 0.003125, 0.003125, 0.003125, 0.003125};
const std::vector<double> kTorchConstant = {0.0, 0.020000000000000004, 0.04000000000000001, 0.06, 0.08000000000000002, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1};

void expectTorch(const LrSchedule& s, const std::vector<double>& torch) {
  for (size_t t = 0; t < torch.size(); ++t) {
    // The optimizer takes a float: the closest float to PyTorch's double, give or take one rounding
    // of the double computation.
    const float want = static_cast<float>(torch[t]);
    EXPECT_NEAR(s.lrAt(static_cast<int64_t>(t)), want, std::abs(want) * 2e-7 + 1e-12) << "step " << t;
  }
}

TEST(LrSchedule, MatchesPyTorchStepByStep) {
  expectTorch(LrSchedule({.kind = LrScheduleKind::kCosine, .baseLr = 0.1, .warmupSteps = 5, .totalSteps = 40, .minLr = 0.001}),
              kTorchCosine);
  expectTorch(LrSchedule({.kind = LrScheduleKind::kStep, .baseLr = 0.1, .warmupSteps = 5, .stepSize = 7, .gamma = 0.5}),
              kTorchStep);
  expectTorch(LrSchedule({.kind = LrScheduleKind::kConstant, .baseLr = 0.1, .warmupSteps = 5}), kTorchConstant);
}

TEST(LrSchedule, WithoutWarmupAndPastTheEnd) {
  LrSchedule cosine({.kind = LrScheduleKind::kCosine, .baseLr = 0.1, .totalSteps = 10, .minLr = 0.0});
  EXPECT_EQ(cosine.lrAt(0), 0.1f);
  EXPECT_NEAR(cosine.lrAt(5), 0.05f, 1e-8);
  EXPECT_EQ(cosine.lrAt(10), 0.0f);
  EXPECT_EQ(cosine.lrAt(1000), 0.0f) << "the floor holds after the last step";
  EXPECT_EQ(LrSchedule({.baseLr = 0.05}).lrAt(123456), 0.05f);
}

TEST(LrSchedule, RefusesWhatTheFormulasCannotTake) {
  EXPECT_THROW(LrSchedule({.kind = LrScheduleKind::kCosine, .baseLr = 0.1, .warmupSteps = 10, .totalSteps = 10}), InvalidArgument);
  EXPECT_THROW(LrSchedule({.kind = LrScheduleKind::kCosine, .baseLr = 0.1, .totalSteps = 10, .minLr = 0.2}), InvalidArgument);
  EXPECT_THROW(LrSchedule({.kind = LrScheduleKind::kStep, .baseLr = 0.1}), InvalidArgument);
  EXPECT_THROW(LrSchedule({.baseLr = 0.1, .warmupSteps = -1}), InvalidArgument);
  EXPECT_THROW(LrSchedule({.baseLr = 0}), InvalidArgument);
  EXPECT_THROW(parseLrScheduleKind("linear"), InvalidArgument);
  EXPECT_EQ(parseLrScheduleKind("cosine"), LrScheduleKind::kCosine);
}

}  // namespace
}  // namespace cohort::nn
