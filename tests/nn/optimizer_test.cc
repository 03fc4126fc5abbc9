// Optimizers against steps computed by hand (exactly representable values), and Adam/AdamW against a
// double-precision transcription of PyTorch's formulas.
#include "nn/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "runtime/error.h"

namespace cohort::nn {
namespace {

using runtime::Shape;

Tensor vec(std::initializer_list<float> v) {
  Tensor t = Tensor::zeros(Shape{static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data());
  return t;
}

TEST(Sgd, PlainStepWithWeightDecay) {
  Tensor p = vec({1.0f, -2.0f}), g = vec({0.5f, 0.25f});
  auto opt = makeOptimizer({.kind = OptimizerKind::kSgd, .lr = 0.5f, .weightDecay = 0.5f}, 2);
  opt->step(p, g);  // d = g + 0.5 p = [1, -0.75]; p -= 0.5 d
  EXPECT_EQ(p.at(0), 0.5f);
  EXPECT_EQ(p.at(1), -1.625f);
  EXPECT_TRUE(opt->state().empty());
}

TEST(Sgd, MomentumInitialisesTheBufferWithTheFirstGradient) {
  Tensor p = vec({1.0f, -2.0f}), g = vec({0.5f, 0.25f});
  auto opt = makeOptimizer({.kind = OptimizerKind::kSgd, .lr = 0.5f, .momentum = 0.5f}, 2);
  opt->step(p, g);  // buf = [0.5, 0.25]
  EXPECT_EQ(p.at(0), 0.75f);
  EXPECT_EQ(p.at(1), -2.125f);
  opt->step(p, g);  // buf = 0.5 buf + g = [0.75, 0.375]
  EXPECT_EQ(p.at(0), 0.375f);
  EXPECT_EQ(p.at(1), -2.3125f);
  ASSERT_EQ(opt->state().size(), 1u);
  EXPECT_EQ(opt->state()[0].name, "momentum_buffer");
  EXPECT_EQ(opt->state()[0].tensor.at(1), 0.375f);
  EXPECT_EQ(opt->steps(), 2);
}

TEST(Sgd, Nesterov) {
  Tensor p = vec({1.0f, -2.0f}), g = vec({0.5f, 0.25f});
  auto opt = makeOptimizer({.kind = OptimizerKind::kSgd, .lr = 0.5f, .momentum = 0.5f, .nesterov = true}, 2);
  opt->step(p, g);  // buf = g; update = g + 0.5 buf = [0.75, 0.375]
  EXPECT_EQ(p.at(0), 0.625f);
  EXPECT_EQ(p.at(1), -2.1875f);
  opt->step(p, g);  // buf = [0.75, 0.375]; update = g + 0.5 buf = [0.875, 0.4375]
  EXPECT_EQ(p.at(0), 0.1875f);
  EXPECT_EQ(p.at(1), -2.40625f);
}

// PyTorch's Adam/AdamW in double, for comparison.
void adamReference(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m,
                   std::vector<double>& v, int t, double lr, double wd, bool decoupled) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  for (size_t i = 0; i < p.size(); ++i) {
    if (decoupled) p[i] *= 1 - lr * wd;
    double gi = g[i] + (decoupled ? 0 : wd * p[i]);
    m[i] = b1 * m[i] + (1 - b1) * gi;
    v[i] = b2 * v[i] + (1 - b2) * gi * gi;
    double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps;
    p[i] -= lr / (1 - std::pow(b1, t)) * m[i] / denom;
  }
}

void checkAdam(bool decoupled) {
  const float lr = 0.125f, wd = 0.25f;
  Tensor p = vec({1.0f, -2.0f, 0.5f}), g = vec({0.5f, 0.25f, -4.0f});
  auto opt = makeOptimizer({.kind = decoupled ? OptimizerKind::kAdamW : OptimizerKind::kAdam, .lr = lr, .weightDecay = wd}, 3);
  std::vector<double> rp = {1.0, -2.0, 0.5}, rm(3), rv(3);
  for (int t = 1; t <= 5; ++t) {
    std::vector<double> rg = {0.5 * t, 0.25, -4.0 / t};
    for (int i = 0; i < 3; ++i) g.at(i) = static_cast<float>(rg[static_cast<size_t>(i)]);
    opt->step(p, g);
    adamReference(rp, rg, rm, rv, t, lr, wd, decoupled);
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(p.at(i), rp[static_cast<size_t>(i)], 2e-6) << "step " << t << " elem " << i;
  }
  EXPECT_EQ(opt->state().size(), 2u);
}

TEST(Adam, FirstStepMovesEachParameterByLrTimesTheGradientSign) {
  Tensor p = vec({1.0f, -2.0f}), g = vec({0.5f, -0.25f});
  auto opt = makeOptimizer({.kind = OptimizerKind::kAdam, .lr = 0.125f}, 2);
  opt->step(p, g);
  EXPECT_NEAR(p.at(0), 0.875f, 1e-6);
  EXPECT_NEAR(p.at(1), -1.875f, 1e-6);
}

TEST(Adam, MatchesPyTorchsFormulaOverSeveralSteps) { checkAdam(false); }
TEST(AdamW, MatchesPyTorchsFormulaOverSeveralSteps) { checkAdam(true); }

TEST(Optimizer, ASweepStartingMidwayGivesIdenticalResults) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    Tensor p1 = vec({1.0f, -2.0f, 0.5f, 3.0f, -1.5f}), p2 = p1.clone(), g = vec({0.5f, 0.25f, -4.0f, 1.0f, 2.0f});
    OptimizerOptions o{.kind = kind, .lr = 0.125f, .momentum = kind == OptimizerKind::kSgd ? 0.5f : 0.0f, .weightDecay = 0.25f};
    auto a = makeOptimizer(o, 5), b = makeOptimizer(o, 5);
    b->setSweepStart(3);
    for (int s = 0; s < 3; ++s) {
      a->step(p1, g);
      b->step(p2, g);
    }
    for (int i = 0; i < 5; ++i) EXPECT_EQ(p1.at(i), p2.at(i)) << "optimizer " << a->name() << " element " << i;
  }
}

// The update runs in blocks with the next block prefetched: every element is updated exactly once,
// whatever the sweep start and however the size falls against the block size.
TEST(Optimizer, BlockedSweepUpdatesEveryElementOnce) {
  for (int64_t n : {int64_t{1}, int64_t{1023}, int64_t{1024}, int64_t{2500}, int64_t{4096}}) {
    for (size_t start : {size_t{0}, size_t{1}, size_t{1203}, static_cast<size_t>(n - 1)}) {
      if (start >= static_cast<size_t>(n)) continue;
      Tensor p = Tensor::zeros(Shape{n}), g = Tensor::zeros(Shape{n});
      for (int64_t i = 0; i < n; ++i) {
        p.data()[i] = static_cast<float>(i % 97) * 0.5f;
        g.data()[i] = static_cast<float>(i % 13) - 6.0f;
      }
      Tensor expected = p.clone();
      const float lr = 0.25f;
      for (int64_t i = 0; i < n; ++i) expected.data()[i] -= lr * g.data()[i];
      auto sgd = makeOptimizer({.lr = lr}, static_cast<size_t>(n));
      sgd->setSweepStart(start);
      sgd->step(p, g);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(p.at(i), expected.at(i)) << "n " << n << " start " << start << " element " << i;
      }
    }
  }
}

// A shard's step with a per-block hook: the hook sees every block of the slice once, before the
// block is updated, and nothing outside the slice changes; state placed in outside memory is used.
TEST(Optimizer, StepSliceUpdatesOnlyTheSliceAfterEachBlocksHook) {
  const int64_t n = 3000, begin = 1008, end = 2500;
  Tensor p = Tensor::zeros(Shape{n}), g = Tensor::zeros(Shape{n});
  for (int64_t i = 0; i < n; ++i) p.data()[i] = static_cast<float>(i % 7);
  auto sgd = makeOptimizer({.lr = 0.5f, .momentum = 0.5f}, static_cast<size_t>(n));
  ASSERT_EQ(sgd->stateFloats(), static_cast<size_t>(n));
  std::vector<float> state(static_cast<size_t>(n), 0.0f);
  sgd->placeState(state.data());
  int64_t covered = 0, expectedBegin = begin;
  sgd->stepSlice(p, g, begin, end, [&](int64_t b, int64_t e) {
    EXPECT_EQ(b, expectedBegin);
    EXPECT_LE(e - b, 1024);
    for (int64_t i = b; i < e; ++i) g.data()[i] = 2.0f;  // e.g. averaged over the ranks here
    covered += e - b;
    expectedBegin = e;
  });
  EXPECT_EQ(covered, end - begin);
  EXPECT_EQ(sgd->steps(), 1);
  for (int64_t i = 0; i < n; ++i) {
    const bool in = i >= begin && i < end;
    ASSERT_EQ(p.at(i), static_cast<float>(i % 7) - (in ? 1.0f : 0.0f)) << "element " << i;
    ASSERT_EQ(state[static_cast<size_t>(i)], in ? 2.0f : 0.0f) << "momentum " << i;  // first step: buf = g
  }
  EXPECT_EQ(sgd->state()[0].tensor.data(), state.data());
}

TEST(Optimizer, RejectsBadOptions) {
  EXPECT_THROW(makeOptimizer({.lr = 0.0f}, 1), InvalidArgument);
  EXPECT_THROW(makeOptimizer({.lr = 0.1f, .momentum = 1.5f}, 1), InvalidArgument);
  EXPECT_THROW(makeOptimizer({.lr = 0.1f, .nesterov = true}, 1), InvalidArgument);
  EXPECT_THROW(makeOptimizer({.lr = 0.1f, .weightDecay = -1}, 1), InvalidArgument);
  EXPECT_THROW(parseOptimizerKind("rmsprop"), InvalidArgument);
}

}  // namespace
}  // namespace cohort::nn
