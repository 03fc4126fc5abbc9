// nn::Gpt (issue 20, item 2): gradients against finite differences (the tied head and the two
// embeddings included), nanoGPT's parameter names with the head stored once, GPT-2's
// initialisation, the context limit, and its parameter units: their events in forward and backward
// order, each unit's gradient final when its after-backward is told.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/loss.h"
#include "nn/optimizer.h"
#include "runtime/cpu/blas.h"
#include "runtime/error.h"
#include "tests/nn/grad_check.h"
#include "tests/nn/unit_recorder.h"

namespace cohort::nn::testing {
namespace {

using runtime::Shape;
using runtime::Tensor;

Tensor tokens(int64_t batch, int64_t time, int64_t vocab, uint64_t seed) {
  runtime::Rng rng(seed);
  Tensor t = Tensor::zeros(Shape{batch, time});
  for (int64_t i = 0; i < t.numel(); ++i) t.at(i) = static_cast<float>(static_cast<int64_t>(rng.uniform(0.0f, 1.0f) * vocab) % vocab);
  return t;
}

// Three blocks: their backward passes share one set of gradient buffers (the input gradient of each
// written where the next one's lay; TransformerBlock::shareBackwardBuffers), which a wrong alias
// would show here.
TEST(Gpt, GradientsMatchFiniteDifferences) {
  for (const auto& [time, heads] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {5, 2}}) {
    Gpt m({.vocab = 7, .layers = 3, .heads = heads, .dim = 8, .context = 6});
    ParamBuffer params;
    bindParams(m, params, 21);
    // GPT-2's initial embeddings (std 0.02) are small next to the check's step of 0.01, and
    // LayerNorm magnifies them: parameters of order 1 keep the finite differences accurate.
    runtime::Rng rng(24);
    for (int64_t i = 0; i < params.values().numel(); ++i) params.values().at(i) = rng.uniform(-1.0f, 1.0f);
    SCOPED_TRACE("time " + std::to_string(time));
    checkModuleGradients(m, params, tokens(2, time, 7, 22), {.checkInput = false});
  }
}

TEST(Gpt, HasNanoGptsNamesWithTheHeadTiedToTheTokenEmbedding) {
  Gpt m({.vocab = 11, .layers = 2, .heads = 2, .dim = 8, .context = 5});
  ParamBuffer params;
  m.registerParams(params, "");
  std::vector<std::string> names;
  for (const auto& e : params.entries()) names.push_back(e.name + e.shape.str());
  EXPECT_EQ(names.front(), "transformer.wte.weight[11, 8]");
  EXPECT_EQ(names[1], "transformer.wpe.weight[5, 8]");
  EXPECT_EQ(names[2], "transformer.h.0.ln_1.weight[8]");
  EXPECT_EQ(names[names.size() - 2], "transformer.ln_f.weight[8]");
  EXPECT_EQ(names.back(), "transformer.ln_f.bias[8]");
  EXPECT_EQ(names.size(), 2u + 2u * 12u + 2u);  // no lm_head: it is wte
}

TEST(Gpt, DeclaresItsEmbeddingsEachBlockAndTheFinalLayerNormAsUnits) {
  Gpt m({.vocab = 11, .layers = 2, .heads = 2, .dim = 8, .context = 5});
  ParamBuffer params;
  m.registerParams(params, "");
  std::vector<std::string> units;
  for (const auto& u : params.units()) units.push_back(u.name + " " + std::to_string(u.endEntry - u.firstEntry));
  EXPECT_EQ(units, (std::vector<std::string>{"transformer.embeddings 2", "transformer.h.0 12", "transformer.h.1 12",
                                             "transformer.ln_f 2"}));
  EXPECT_EQ(params.units().back().offset + params.units().back().numel, params.numel());
}

// The tied head reads wte after ln_f in forward and writes wte's gradient first in backward, so the
// embeddings unit is open around everything else; its after-backward comes last, once the token
// embedding's gradient has been added. Every unit's gradient, copied when its after-backward is
// told, equals the gradient when backward returns: nothing writes it later (GradSync all-reduces it
// from that moment).
TEST(Gpt, TellsTheUnitsInForwardAndBackwardOrderWithEachGradientFinalWhenTold) {
  Gpt m({.vocab = 7, .layers = 2, .heads = 2, .dim = 8, .context = 4});
  ParamBuffer params;
  bindParams(m, params, 25);
  for (bool accumulate : {false, true}) {
    UnitRecorder spy;
    std::vector<std::pair<ParamBuffer::Unit, Tensor>> told;  // each unit's gradient at its after-backward
    spy.onEvent = [&](const std::string& event, const ParamBuffer::Unit& u) {
      if (event.rfind("after-backward", 0) != 0) return;
      told.emplace_back(
          u, params.grads().narrowRows(static_cast<int64_t>(u.offset), static_cast<int64_t>(u.numel)).clone());
    };
    Pass pass;
    pass.units = &spy;
    pass.accumulateGrads = accumulate;
    const Tensor& logits = m.forward(tokens(2, 4, 7, 26), pass);
    m.backward(randomTensor(logits.shape(), 27), pass);
    const std::vector<std::string> events = {
        "before-forward transformer.embeddings",  "before-forward transformer.h.0",
        "after-forward transformer.h.0",          "before-forward transformer.h.1",
        "after-forward transformer.h.1",          "before-forward transformer.ln_f",
        "after-forward transformer.ln_f",         "after-forward transformer.embeddings",
        "before-backward transformer.embeddings", "before-backward transformer.ln_f",
        "after-backward transformer.ln_f",        "before-backward transformer.h.1",
        "after-backward transformer.h.1",         "before-backward transformer.h.0",
        "after-backward transformer.h.0",         "after-backward transformer.embeddings"};
    EXPECT_EQ(spy.events, events);
    ASSERT_EQ(told.size(), 4u);
    for (const auto& [unit, grad] : told) {
      const Tensor now = params.grads().narrowRows(static_cast<int64_t>(unit.offset), static_cast<int64_t>(unit.numel));
      for (int64_t i = 0; i < grad.numel(); ++i) ASSERT_EQ(grad.at(i), now.at(i)) << unit.name << " element " << i;
    }
  }
}

TEST(Gpt, InitialisesAsGpt2) {
  const int64_t layers = 4;
  Gpt m({.vocab = 64, .layers = layers, .heads = 4, .dim = 64, .context = 32});
  ParamBuffer params;
  bindParams(m, params, 23);
  auto stdOf = [&](const std::string& name) {
    for (size_t i = 0; i < params.entries().size(); ++i) {
      if (params.entries()[i].name != name) continue;
      const Tensor t = params.value(i);
      double sum = 0, squares = 0;
      for (int64_t k = 0; k < t.numel(); ++k) sum += t.at(k), squares += static_cast<double>(t.at(k)) * t.at(k);
      const double mean = sum / static_cast<double>(t.numel());
      return std::sqrt(squares / static_cast<double>(t.numel()) - mean * mean);
    }
    ADD_FAILURE() << "no parameter " << name;
    return 0.0;
  };
  EXPECT_NEAR(stdOf("transformer.wte.weight"), 0.02, 0.002);
  EXPECT_NEAR(stdOf("transformer.h.1.attn.c_attn.weight"), 0.02, 0.002);
  EXPECT_NEAR(stdOf("transformer.h.1.mlp.c_fc.weight"), 0.02, 0.002);
  const double residual = 0.02 / std::sqrt(2.0 * layers);
  EXPECT_NEAR(stdOf("transformer.h.1.attn.c_proj.weight"), residual, residual / 10);
  EXPECT_NEAR(stdOf("transformer.h.3.mlp.c_proj.weight"), residual, residual / 10);
  EXPECT_EQ(stdOf("transformer.h.0.attn.c_attn.bias"), 0.0);
  EXPECT_EQ(stdOf("transformer.h.0.ln_1.weight"), 0.0);  // all 1
}

TEST(Gpt, RefusesWhatItCannotRun) {
  EXPECT_THROW(Gpt({.vocab = 4, .layers = 1, .heads = 3, .dim = 8, .context = 4}), InvalidArgument);
  EXPECT_THROW(Gpt({.vocab = 0, .layers = 1, .heads = 1, .dim = 8, .context = 4}), InvalidArgument);
  Gpt m({.vocab = 4, .layers = 1, .heads = 2, .dim = 8, .context = 4});
  EXPECT_THROW(m.outputShape(Shape{2, 5}), InvalidArgument);  // longer than the context
  EXPECT_THROW(m.outputShape(Shape{2, 3, 1}), InvalidArgument);
  EXPECT_EQ(m.outputShape(Shape{2, 4}), (Shape{2, 4, 4}));
}

// With --threads 2 the loops between the GEMMs run in chunks on two threads
// (runtime::cpu::parallelRange): row by row they compute what one thread does; the sums that cross
// rows (LayerNorm's weight and bias gradients, the loss) add the chunks' partial sums in chunk order.
// oneDNN's GEMMs may split their sums between threads too (on an AVX2-only CPU they do: the logits
// then differ from one thread's in the last bit), so one thread and two agree within float rounding
// (a chunk combined wrongly is off by far more), and two runs with two threads agree bit for bit.
TEST(Gpt, TwoThreadsComputeWhatOneDoes) {
  struct Run {
    Tensor logits, grads, stepped;
    float loss = 0;
  };
  auto run = [](int threads) {
    runtime::cpu::BlasThreadsScope scope(threads);
    Gpt m({.vocab = 32, .layers = 2, .heads = 2, .dim = 32, .context = 16});
    ParamBuffer params;
    bindParams(m, params, 31);
    SoftmaxCrossEntropy loss;
    Pass pass;
    const Tensor ids = tokens(64, 16, 32, 32);  // 1024 rows: two chunks of LayerNorm's 512
    Run r;
    r.logits = m.forward(ids, pass).clone();
    Tensor targets = tokens(64, 16, 32, 33);
    r.loss = loss.forward(r.logits, targets);
    m.backward(loss.backward(), pass);
    r.grads = params.grads().clone();
    auto adamw = makeOptimizer({.kind = OptimizerKind::kAdamW, .lr = 0.01f}, static_cast<size_t>(params.numel()));
    adamw->step(params.values(), params.grads());
    r.stepped = params.values().clone();
    return r;
  };
  {
    runtime::cpu::BlasThreadsScope scope(2);
    ASSERT_EQ(runtime::cpu::parallelChunks(1024, runtime::cpu::rowGrain(32)), 2);  // the rows are split
  }
  const Run one = run(1), two = run(2), again = run(2);
  ASSERT_EQ(one.logits.numel(), two.logits.numel());
  float largest = 0;
  for (int64_t i = 0; i < one.logits.numel(); ++i) largest = std::max(largest, std::abs(one.logits.at(i)));
  for (int64_t i = 0; i < one.logits.numel(); ++i) {
    ASSERT_NEAR(one.logits.at(i), two.logits.at(i), 1e-6f * largest) << "logit " << i;
    ASSERT_EQ(two.logits.at(i), again.logits.at(i)) << "logit " << i << " differs between two runs with 2 threads";
  }
  EXPECT_NEAR(one.loss, two.loss, 1e-6 * std::abs(one.loss));
  double worst = 0;
  for (int64_t i = 0; i < one.grads.numel(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(one.grads.at(i)) - two.grads.at(i)) /
                                (std::abs(static_cast<double>(one.grads.at(i))) + 1e-3));
    ASSERT_EQ(two.grads.at(i), again.grads.at(i)) << "gradient " << i << " differs between two runs with 2 threads";
    ASSERT_EQ(two.stepped.at(i), again.stepped.at(i)) << "parameter " << i;
  }
  EXPECT_LT(worst, 1e-5);
  EXPECT_EQ(two.loss, again.loss);
}

}  // namespace
}  // namespace cohort::nn::testing
