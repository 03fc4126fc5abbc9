// Parameter groups (nn::ParamGroup, OptimizerOptions::groups) and nanoGPT's grouping
// (nn::decayMatricesOnly): decay and learning rate applied only where a group says (exactly
// representable values), a step over slices that cross groups equal bit for bit to the whole
// buffer's, the grouping of a GPT's parameters, and bad groups refused.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "nn/model.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "nn/param_buffer.h"
#include "runtime/error.h"
#include "runtime/random.h"

namespace cohort::nn {
namespace {

using runtime::Shape;

Tensor filled(int64_t n, float value) {
  Tensor t = Tensor::zeros(Shape{n});
  for (int64_t i = 0; i < n; ++i) t.at(i) = value;
  return t;
}

Tensor randomTensor(int64_t n, uint64_t seed) {
  runtime::Rng rng(seed);
  Tensor t = Tensor::zeros(Shape{n});
  for (int64_t i = 0; i < n; ++i) t.at(i) = rng.uniform(-2.0f, 2.0f);
  return t;
}

bool sameBits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

// AdamW with a zero gradient moves nothing but the decay: p · (1 − lr·wd) in the decayed group
// (lr 0.5, wd 0.5: p · 0.75), p unchanged elsewhere, the options' decay outside every group.
TEST(ParamGroups, AdamWDecaysOnlyWhereTheGroupSays) {
  Tensor p = filled(10, 2.0f), g = filled(10, 0.0f);
  auto opt = makeOptimizer({.kind = OptimizerKind::kAdamW, .lr = 0.5f, .weightDecay = 0.25f,
                            .groups = {{.begin = 1, .end = 4, .weightDecay = 0.5f}, {.begin = 4, .end = 8}}},
                           10);
  opt->step(p, g);
  const std::vector<float> want = {1.75f, 1.5f, 1.5f, 1.5f, 2.0f, 2.0f, 2.0f, 2.0f, 1.75f, 1.75f};
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(p.at(i), want[static_cast<size_t>(i)]) << "element " << i;
}

// SGD: p −= lr·scale·(g + wd·p) with each group's decay and scale.
TEST(ParamGroups, SgdTakesEachGroupsLearningRateScale) {
  Tensor p = filled(6, 1.0f), g = filled(6, 0.5f);
  auto opt = makeOptimizer({.kind = OptimizerKind::kSgd, .lr = 0.5f,
                            .groups = {{.begin = 0, .end = 2, .weightDecay = 0.5f, .lrScale = 2.0f},
                                       {.begin = 4, .end = 6, .lrScale = 0.5f}}},
                           6);
  opt->step(p, g);
  const std::vector<float> want = {0.0f, 0.0f, 0.75f, 0.75f, 0.875f, 0.875f};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(p.at(i), want[static_cast<size_t>(i)]) << "element " << i;
}

// Slices cut anywhere (Hogwild's and sharded sync's stepSlice), crossing the groups' edges, give the
// whole step's bits; so do the multithreaded whole step and a Hogwild sweep start.
TEST(ParamGroups, SlicesCrossingGroupsStepAsTheWholeBuffer) {
  const int64_t n = 5000;
  const OptimizerOptions options{.kind = OptimizerKind::kAdamW, .lr = 1e-2f, .weightDecay = 0.1f,
                                 .groups = {{.begin = 0, .end = 1000, .weightDecay = 0.0f},
                                            {.begin = 1000, .end = 1003, .weightDecay = 0.3f, .lrScale = 0.25f},
                                            {.begin = 2047, .end = 4100, .weightDecay = 0.0f, .lrScale = 4.0f}}};
  Tensor whole = randomTensor(n, 1), sliced = whole.clone(), swept = whole.clone();
  auto a = makeOptimizer(options, n), b = makeOptimizer(options, n), c = makeOptimizer(options, n);
  c->setSweepStart(3001);
  const std::vector<int64_t> cuts = {0, 1, 999, 1002, 2500, 4099, 4100, n};
  for (int step = 0; step < 3; ++step) {
    const Tensor grads = randomTensor(n, 10 + static_cast<uint64_t>(step));
    a->step(whole, grads);
    c->step(swept, grads);
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      b->setSteps(step);  // each slice counts as a step of its own
      b->stepSlice(sliced, grads, cuts[i], cuts[i + 1], {});
    }
    ASSERT_TRUE(sameBits(sliced, whole)) << "step " << step;
    ASSERT_TRUE(sameBits(swept, whole)) << "step " << step;
  }
  // And the groups mattered: without them the same steps end elsewhere.
  Tensor plain = randomTensor(n, 1);
  auto d = makeOptimizer({.kind = OptimizerKind::kAdamW, .lr = 1e-2f, .weightDecay = 0.1f}, n);
  for (int step = 0; step < 3; ++step) d->step(plain, randomTensor(n, 10 + static_cast<uint64_t>(step)));
  EXPECT_FALSE(sameBits(plain, whole));
}

// nanoGPT's configure_optimizers: decay on every parameter of two or more dimensions.
TEST(ParamGroups, DecayMatricesOnlyGroupsAGptAsNanoGpt) {
  auto model = buildModel("gpt:layers=2,heads=2,dim=16,ctx=8,vocab=40");
  model->params.allocate(runtime::cpuAllocator());
  const std::vector<ParamGroup> groups = decayMatricesOnly(model->params, 0.1f);
  ASSERT_FALSE(groups.empty());
  size_t decayed = 0, covered = 0, entries = 0;
  for (const ParamBuffer::Entry& e : model->params.entries()) {
    const bool matrix = e.shape.rank() >= 2;
    entries += e.numel;
    decayed += matrix ? e.numel : 0;
    for (const ParamGroup& g : groups) {
      if (g.begin <= e.offset && e.offset + e.numel <= g.end) {
        EXPECT_EQ(g.weightDecay, matrix ? 0.1f : 0.0f) << e.name;
        EXPECT_EQ(g.lrScale, 1.0f) << e.name;
        covered += e.numel;
      }
    }
  }
  EXPECT_EQ(covered, entries);  // every element of every entry in exactly one group
  // wte, wpe, and per block c_attn, attn.c_proj, c_fc, mlp.c_proj weights.
  EXPECT_EQ(decayed, size_t{40 * 16 + 8 * 16 + 2 * (16 * 48 + 16 * 16 + 16 * 64 + 64 * 16)});
  for (size_t i = 1; i < groups.size(); ++i) {
    EXPECT_LE(groups[i - 1].end, groups[i].begin);
    EXPECT_NE(groups[i - 1].weightDecay, groups[i].weightDecay);  // adjacent entries of one kind merged
  }
  EXPECT_NO_THROW(makeOptimizer({.kind = OptimizerKind::kAdamW, .groups = groups}, model->params.numel()));
}

TEST(ParamGroups, RefusesGroupsThatOverlapAreEmptyOrRunPastTheBuffer) {
  auto make = [](std::vector<ParamGroup> groups) { return makeOptimizer({.groups = std::move(groups)}, 10); };
  EXPECT_THROW(make({{.begin = 0, .end = 5}, {.begin = 4, .end = 6}}), InvalidArgument);
  EXPECT_THROW(make({{.begin = 5, .end = 8}, {.begin = 0, .end = 2}}), InvalidArgument);
  EXPECT_THROW(make({{.begin = 3, .end = 3}}), InvalidArgument);
  EXPECT_THROW(make({{.begin = 0, .end = 11}}), InvalidArgument);
  EXPECT_THROW(make({{.begin = 0, .end = 2, .weightDecay = -1.0f}}), InvalidArgument);
  EXPECT_THROW(make({{.begin = 0, .end = 2, .lrScale = 0.0f}}), InvalidArgument);
  EXPECT_NO_THROW(make({{.begin = 0, .end = 5}, {.begin = 5, .end = 10}}));
}

}  // namespace
}  // namespace cohort::nn
