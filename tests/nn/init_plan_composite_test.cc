// Piecewise initialisation through the composites' own plans (Sequential, Residual,
// TransformerBlock, CausalSelfAttention, Gpt implement nn::PlannedInit): every rank's pieces of a
// GPT (2 layers, width 32, 2 heads, vocabulary 100, context 16) and of a nested MLP equal the whole
// model's resetParams bit for bit at world sizes 1..4, and a model holding a layer that cannot be
// planned is refused naming that layer. (init_plan_test.cc checks the GPT's resetParams against the
// drawing it replaced.)
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "nn/activation.h"
#include "nn/gpt.h"
#include "nn/init_plan.h"
#include "nn/linear.h"
#include "nn/residual.h"
#include "nn/sequential.h"
#include "nn/shard_map.h"
#include "runtime/error.h"
#include "tests/nn/piecewise_init.h"

namespace cohort::nn {
namespace {

using runtime::Rng;
using testing::Drawn;
using testing::expectPiecesMatchWhole;

// GPT units: each block "transformer.h.<i>", and "transformer.wte", "transformer.wpe",
// "transformer.ln_f".
std::string gptUnit(const std::string& name) {
  const std::string block = "transformer.h.";
  if (name.rfind(block, 0) == 0) return name.substr(0, name.find('.', block.size()));
  return name.substr(0, name.find('.', name.find('.') + 1));
}

TEST(InitPlanComposite, GptPiecesEqualTheWholeModelsSlices) {
  const GptOptions o{.vocab = 100, .layers = 2, .heads = 2, .dim = 32, .context = 16};
  expectPiecesMatchWhole({
      .make = [&]() -> ModulePtr { return std::make_unique<Gpt>(o); },
      .plan = planModel,
      .unitOf = gptUnit,
      .seed = 1234,
  });
}

TEST(InitPlanComposite, NestedMlpPiecesEqualTheWholeModelsSlices) {
  expectPiecesMatchWhole({
      .make = []() -> ModulePtr {
        auto inner = std::make_unique<Sequential>();
        inner->add(std::make_unique<Linear>(16, 16), "fc0").add(relu()).add(std::make_unique<Linear>(16, 16), "fc1");
        auto net = std::make_unique<Sequential>();
        net->add(std::make_unique<Linear>(9, 16), "in")
            .add(std::make_unique<Residual>(std::move(inner)), "res0")
            .add(tanhActivation())
            .add(std::make_unique<Linear>(16, 4), "out");
        return net;
      },
      .plan = planModel,
      .seed = 99,
  });
}

// The map of a GPT's own units (shardMapOf): one unit per block, the embeddings and the final
// LayerNorm, tiling the buffer; each rank's shard filled from the plan is the whole model's packed.
TEST(InitPlanComposite, AGptsShardsFromItsOwnUnitsEqualTheWholeModelPacked) {
  const GptOptions o{.vocab = 100, .layers = 3, .heads = 2, .dim = 32, .context = 16};
  Gpt whole(o);
  ParamBuffer wholeParams;
  whole.registerParams(wholeParams, "");
  wholeParams.allocate(runtime::cpuAllocator());
  Rng rng(77);
  whole.resetParams(rng);
  Gpt planned(o);  // never bound: no rank holds the whole model
  ParamBuffer params;
  planned.registerParams(params, "");
  const InitPlan plan = planModel(planned, Rng(77));
  for (int world = 1; world <= 4; ++world) {
    for (int rank = 0; rank < world; ++rank) {
      const ShardMap map = shardMapOf(params, {.worldSize = world, .rank = rank});
      ASSERT_EQ(map.numel(), params.numel());
      ASSERT_EQ(map.units(), params.units().size());
      EXPECT_GE(map.units(), static_cast<size_t>(o.layers) + 2) << "the blocks, the embeddings and ln_f";
      std::vector<float> shard(map.shardNumel(), -1.0f), expected(map.shardNumel(), 0.0f);
      plan.fillShard(params, map, rank, shard.data());
      map.pack(wholeParams.values().data(), rank, expected.data());
      ASSERT_EQ(std::memcmp(shard.data(), expected.data(), shard.size() * sizeof(float)), 0)
          << "rank " << rank << " of " << world;
    }
  }
}

// The message planning `net` throws (empty when it does not).
std::string planError(Sequential& net) {
  ParamBuffer params;
  net.registerParams(params, "");
  try {
    planModel(net, Rng(1));
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(InitPlanComposite, RefusesAModelWithALayerItCannotPlanNamingIt) {
  Sequential nested;
  auto block = std::make_unique<Sequential>();
  block->add(std::make_unique<Linear>(2, 2), "fc0").add(std::make_unique<Drawn>(), "d");
  nested.add(std::make_unique<Linear>(2, 2), "in").add(std::move(block), "block1");
  EXPECT_EQ(planError(nested).rfind("layer block1.d: Drawn(2) initialises its parameters in resetParams", 0), 0u)
      << planError(nested);

  Sequential wrapped;
  wrapped.add(std::make_unique<Residual>(std::make_unique<Drawn>()), "res0");
  EXPECT_EQ(planError(wrapped).rfind("layer res0: Drawn(2) initialises", 0), 0u) << planError(wrapped);

  // Whole-model initialisation still works, drawing as before.
  ParamBuffer params;
  nested.registerParams(params, "");
  params.allocate(runtime::cpuAllocator());
  Rng rng(3);
  nested.resetParams(rng);
  EXPECT_EQ(rng.counter(), 4u + 2u + 4u + 2u + 2u);

  // Parameter-free layers need no plan.
  Sequential plain;
  plain.add(relu()).add(std::make_unique<Linear>(3, 1), "fc").add(tanhActivation());
  EXPECT_EQ(planError(plain), "");
}

}  // namespace
}  // namespace cohort::nn
