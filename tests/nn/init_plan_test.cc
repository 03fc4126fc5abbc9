// InitPlan: resetParams gives the values the sequential drawing gave before plans (a copy of that
// code is written inline below for Linear, Conv2d, Embedding and the GPT), and a rank's pieces
// filled from the plan of an unbound model equal the whole model's slices bit for bit, for an MLP
// and a CNN at world sizes 1..4. (The GPT's pieces, and Sequential's own planInit, are checked by
// init_plan_composite_test.cc, which builds once the composites implement PlannedInit.)
#include "nn/init_plan.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "nn/activation.h"
#include "nn/batchnorm.h"
#include "nn/conv2d.h"
#include "nn/embedding.h"
#include "nn/gpt.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"
#include "nn/pool.h"
#include "nn/reshape.h"
#include "nn/sequential.h"
#include "runtime/error.h"
#include "tests/nn/piecewise_init.h"

namespace cohort::nn {
namespace {

using runtime::Rng;

using testing::Drawn;
using testing::expectPiecesMatchWhole;
using testing::sameBits;
using testing::valuesOf;

// ---- The drawing before plans, copied from the old resetParams ----

float* valuesAt(const ParamBuffer& p, const std::string& name) {
  const ParamBuffer::Entry* e = p.find(name);
  EXPECT_NE(e, nullptr) << name;
  return p.values().data() + e->offset;
}
size_t numelOf(const ParamBuffer& p, const std::string& name) { return p.find(name)->numel; }

void oldUniform(const ParamBuffer& p, const std::string& name, float bound, Rng& rng) {
  float* v = valuesAt(p, name);
  for (size_t i = 0; i < numelOf(p, name); ++i) v[i] = rng.uniform(-bound, bound);
}
// Embedding::resetParams: scaled in double.
void oldEmbeddingNormal(const ParamBuffer& p, const std::string& name, float std, Rng& rng) {
  float* v = valuesAt(p, name);
  for (size_t i = 0; i < numelOf(p, name); ++i) v[i] = static_cast<float>(rng.normal() * std);
}
// Gpt's fillNormal: rounded, then scaled in float.
void oldGptNormal(const ParamBuffer& p, const std::string& name, float std, Rng& rng) {
  float* v = valuesAt(p, name);
  for (size_t i = 0; i < numelOf(p, name); ++i) v[i] = static_cast<float>(rng.normal()) * std;
}
void oldConstant(const ParamBuffer& p, const std::string& name, float value) {
  std::fill(valuesAt(p, name), valuesAt(p, name) + numelOf(p, name), value);
}

void oldGptInit(const ParamBuffer& p, const GptOptions& o, Rng& rng) {
  oldEmbeddingNormal(p, "transformer.wte.weight", 0.02f, rng);
  oldEmbeddingNormal(p, "transformer.wpe.weight", 0.02f, rng);
  const float residual = 0.02f / std::sqrt(2.0f * static_cast<float>(o.layers));
  const float bound = 1.0f / std::sqrt(static_cast<float>(o.dim)),
              bound4 = 1.0f / std::sqrt(static_cast<float>(4 * o.dim));
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    // block->resetParams: the LayerNorms and every Linear uniform ...
    oldConstant(p, h + "ln_1.weight", 1.0f);
    oldConstant(p, h + "ln_1.bias", 0.0f);
    for (const char* linear : {"attn.c_attn.", "attn.c_proj.", "ln_2.", "mlp.c_fc.", "mlp.c_proj."}) {
      const std::string prefix = h + linear;
      if (prefix == h + "ln_2.") {
        oldConstant(p, prefix + "weight", 1.0f);
        oldConstant(p, prefix + "bias", 0.0f);
        continue;
      }
      const float b = prefix == h + "mlp.c_proj." ? bound4 : bound;
      oldUniform(p, prefix + "weight", b, rng);
      oldUniform(p, prefix + "bias", b, rng);
    }
    // ... then the Linears redrawn normal, biases 0.
    for (const char* linear : {"attn.c_attn.", "attn.c_proj.", "mlp.c_fc.", "mlp.c_proj."}) {
      const bool projection = std::string(linear).find("c_proj") != std::string::npos;
      oldGptNormal(p, h + linear + "weight", projection ? residual : 0.02f, rng);
      oldConstant(p, h + linear + "bias", 0.0f);
    }
  }
  oldConstant(p, "transformer.ln_f.weight", 1.0f);
  oldConstant(p, "transformer.ln_f.bias", 0.0f);
}

// resetParams of a module and the old drawing (`old`, on a second instance's binding of the same
// layout) give the same bits and leave their Rngs at the same counter.
template <class M, class Old>
void expectResetUnchanged(M& module, M& copy, Old old) {
  ParamBuffer now, before;
  module.registerParams(now, "");
  now.allocate(runtime::cpuAllocator());
  copy.registerParams(before, "");
  before.allocate(runtime::cpuAllocator());
  Rng a(42, 5), b(42, 5);
  module.resetParams(a);
  old(before, b);
  ASSERT_GT(now.numel(), 0u);
  EXPECT_TRUE(sameBits(valuesOf(now), valuesOf(before))) << module.name();
  EXPECT_EQ(a.counter(), b.counter()) << module.name();
}

TEST(InitPlan, ResetParamsGivesTheValuesOfTheSequentialDrawing) {
  Linear fc(7, 5), fc2(7, 5);
  expectResetUnchanged(fc, fc2, [](const ParamBuffer& p, Rng& rng) {
    oldUniform(p, "weight", 1.0f / std::sqrt(7.0f), rng);
    oldUniform(p, "bias", 1.0f / std::sqrt(7.0f), rng);
  });
  Linear noBias({.in = 6, .out = 3, .bias = false}), noBias2({.in = 6, .out = 3, .bias = false});
  expectResetUnchanged(noBias, noBias2,
                       [](const ParamBuffer& p, Rng& rng) { oldUniform(p, "weight", 1.0f / std::sqrt(6.0f), rng); });
  Conv2d conv({.in = 3, .out = 4, .kernel = 3, .kernelW = 2}), conv2({.in = 3, .out = 4, .kernel = 3, .kernelW = 2});
  expectResetUnchanged(conv, conv2, [](const ParamBuffer& p, Rng& rng) {
    oldUniform(p, "weight", 1.0f / std::sqrt(18.0f), rng);
    oldUniform(p, "bias", 1.0f / std::sqrt(18.0f), rng);
  });
  Embedding embedding({.vocab = 11, .dim = 6, .initStd = 0.3f}), embedding2({.vocab = 11, .dim = 6, .initStd = 0.3f});
  expectResetUnchanged(embedding, embedding2,
                       [](const ParamBuffer& p, Rng& rng) { oldEmbeddingNormal(p, "weight", 0.3f, rng); });
  LayerNorm ln(9), ln2(9);
  expectResetUnchanged(ln, ln2, [](const ParamBuffer& p, Rng&) {
    oldConstant(p, "weight", 1.0f);
    oldConstant(p, "bias", 0.0f);
  });
  const GptOptions o{.vocab = 100, .layers = 2, .heads = 2, .dim = 32, .context = 16};
  Gpt gpt(o), gpt2(o);
  expectResetUnchanged(gpt, gpt2, [&](const ParamBuffer& p, Rng& rng) { oldGptInit(p, o, rng); });
}

TEST(InitPlan, BatchNormResetsItsRunningStatistics) {
  BatchNorm2d bn(3);
  ParamBuffer params;
  bn.registerParams(params, "bn.");
  params.allocate(runtime::cpuAllocator());
  params.buffers().fill(5.0f);
  params.values().fill(5.0f);
  Rng rng(1);
  bn.resetParams(rng);
  EXPECT_EQ(rng.counter(), 0u);
  const float* weight = params.value(0).data();
  const float* bias = params.value(1).data();
  EXPECT_EQ(std::vector<float>(weight, weight + 3), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(std::vector<float>(bias, bias + 3), (std::vector<float>{0, 0, 0}));
  const float* mean = params.buffer(0).data();
  const float* var = params.buffer(1).data();
  EXPECT_EQ(std::vector<float>(mean, mean + 3), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(std::vector<float>(var, var + 3), (std::vector<float>{1, 1, 1}));
}

// ---- Piece by piece ----

// What Sequential::planInit does once it implements PlannedInit (the composites' patch): its
// children's plans in order; the children without one here have no parameters.
InitPlan planChildren(const Module& model, Rng start) {
  auto& net = const_cast<Sequential&>(dynamic_cast<const Sequential&>(model));
  InitPlan plan(start);
  for (size_t i = 0; i < net.size(); ++i) {
    if (const auto* child = dynamic_cast<const PlannedInit*>(&net.at(i))) child->planInit(plan);
  }
  return plan;
}

TEST(InitPlan, MlpPiecesEqualTheWholeModelsSlices) {
  expectPiecesMatchWhole({
      .make = []() -> ModulePtr {
        auto net = std::make_unique<Sequential>();
        net->add(std::make_unique<Linear>(20, 33), "fc0")
            .add(relu())
            .add(std::make_unique<Linear>(33, 17), "fc1")
            .add(tanhActivation())
            .add(std::make_unique<Linear>(LinearOptions{.in = 17, .out = 3, .bias = false}), "fc2");
        return net;
      },
      .plan = planChildren,
      .seed = 7,
  });
}

TEST(InitPlan, CnnPiecesEqualTheWholeModelsSlices) {
  expectPiecesMatchWhole({
      .make = []() -> ModulePtr {
        auto net = std::make_unique<Sequential>();
        net->add(std::make_unique<Conv2d>(Conv2dOptions{.in = 3, .out = 8, .kernel = 3, .padding = 1}), "conv0")
            .add(std::make_unique<BatchNorm2d>(8), "bn0")
            .add(relu())
            .add(std::make_unique<MaxPool2d>(2))
            .add(std::make_unique<Conv2d>(Conv2dOptions{.in = 8, .out = 5, .kernel = 3, .bias = false}), "conv1")
            .add(std::make_unique<Flatten>())
            .add(std::make_unique<Linear>(5 * 2 * 2, 10), "fc");
        return net;
      },
      .plan = planChildren,
      .seed = 11,
  });
}

// ---- Refusals ----

TEST(InitPlan, RefusesWhatItCannotPlan) {
  Drawn drawn;
  try {
    planModel(drawn, Rng(1));
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("Drawn(2) initialises its parameters in resetParams"), std::string::npos)
        << e.what();
  }
  InitPlan plan(Rng(1));
  try {
    planChild(drawn, 2, 3, plan);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("Drawn(2) initialises its parameters in resetParams"), std::string::npos)
        << e.what();
  }
  planChild(drawn, 3, 3, plan);  // no parameters: nothing to plan, nothing refused
  EXPECT_EQ(plan.counter(), 0u);

  Linear unregistered(3, 2);
  EXPECT_THROW(planModel(unregistered, Rng(1)), InvalidArgument);

  // A plan checked against a registration it was not made for names the parameter.
  Linear fc(3, 2);
  ParamBuffer params;
  fc.registerParams(params, "fc.");
  InitPlan linearPlan = planModel(fc, Rng(1));
  EXPECT_EQ(linearPlan.counter(), 8u);
  Linear other(4, 2);
  ParamBuffer otherParams;
  other.registerParams(otherParams, "other.");
  try {
    linearPlan.check(otherParams);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'other.weight', which has 8"), std::string::npos) << e.what();
  }
  ParamBuffer withDrawn;
  fc.registerParams(withDrawn, "fc.");
  drawn.registerParams(withDrawn, "d.");
  InitPlan partial = planModel(fc, Rng(1));
  std::vector<float> out(withDrawn.numel());
  EXPECT_THROW(partial.fillRange(withDrawn, 0, 1, out.data()), InvalidArgument);  // d.w has no fill
  const ShardMap map({{"all", withDrawn.numel() + 1}}, {.worldSize = 1, .rank = 0});
  EXPECT_THROW(linearPlan.fillShard(params, map, 0, out.data()), InvalidArgument);  // map of another size
}

TEST(InitPlan, ARecordedFillReplacesTheEarlierOneWhoseDrawsStayConsumed) {
  Linear fc(4, 3);
  ParamBuffer params;
  fc.registerParams(params, "");
  InitPlan plan(Rng(9, 100));
  fc.planInit(plan);                                                    // 12 + 3 uniform draws
  plan.normal(fc.weightTarget(), 0.5f, InitPlan::NormalScale::kFloat);  // 24 more
  plan.constant(fc.biasTarget(), 0.25f);
  plan.skip(4);
  EXPECT_EQ(plan.counter(), 100u + 15u + 24u + 4u);
  std::vector<float> out(params.numel(), -1.0f);
  plan.fillRange(params, 0, params.numel(), out.data());
  Rng rng(9, 115);
  const size_t bias = params.entries()[1].offset;  // after the weight's 12 and alignment padding
  ASSERT_EQ(bias, 16u);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(out[i], static_cast<float>(rng.normal()) * 0.5f) << i;
  for (size_t i = 12; i < bias; ++i) EXPECT_EQ(out[i], 0.0f);
  for (size_t i = bias; i < bias + 3; ++i) EXPECT_EQ(out[i], 0.25f);
}

}  // namespace
}  // namespace cohort::nn
