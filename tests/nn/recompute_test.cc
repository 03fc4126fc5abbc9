// Activation recompute (issue 46, item 2): nn::Recompute around any module, and a GPT's
// GptOptions::recompute, give the gradients of the same model without recompute bit for bit, with
// dropout's masks replayed, over micro-batches that accumulate, a batch that grows and an evaluation
// pass between; the wrapper tells each unit's events once, beforeBackward before the recomputed
// forward reads the unit's parameters. The memory it saves is measured by the benchmark
// (bench/recompute_bench.h) and checked against nn/gpt_memory.h here.
#include "nn/recompute.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "nn/activation.h"
#include "nn/dropout.h"
#include "nn/gelu.h"
#include "nn/gpt.h"
#include "nn/gpt_memory.h"
#include "nn/linear.h"
#include "nn/sequential.h"
#include "runtime/error.h"
#include "tests/nn/grad_check.h"
#include "tests/nn/token_ids.h"
#include "tests/nn/unit_recorder.h"

namespace cohort::nn::testing {
namespace {

using runtime::Shape;
using runtime::Tensor;

bool sameBits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), static_cast<size_t>(a.numel()) * sizeof(float)) == 0;
}

using cohort::testing::randomTokenIds;

// What a run of passes leaves: every gradient (accumulated), the last logits and input gradient.
struct Outcome {
  Tensor grads, output, inputGrad;
  uint64_t rngCounter = 0;
};

// Two micro-batches that accumulate, an evaluation pass on a larger batch between them (the shared
// buffers grow there), then the second; the output gradient is a fixed function of the output.
// `between`, when given, runs between each forward and its backward.
Outcome train(Module& m, ParamBuffer& params, const std::vector<Tensor>& inputs, runtime::Rng rng,
              const std::function<void()>& between = nullptr) {
  Outcome o;
  params.grads().fill(0.0f);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (i == 1) {
      Shape s = inputs[0].shape();
      s[0] *= 3;
      Tensor wide = Tensor::zeros(s);
      for (int64_t k = 0; k < wide.numel(); ++k) wide.at(k) = inputs[0].at(k % inputs[0].numel());
      m.forward(wide, {.training = false});
    }
    const Pass pass{.training = true, .accumulateGrads = true, .rng = &rng};
    const Tensor& y = m.forward(inputs[i], pass);
    o.output = y.clone();
    Tensor g = Tensor::zeros(y.shape());
    for (int64_t k = 0; k < g.numel(); ++k) g.at(k) = 0.01f * y.at(k) + static_cast<float>(k % 7) * 1e-3f;
    if (between) between();
    const Tensor& dx = m.backward(g, pass);
    if (dx.defined()) o.inputGrad = dx.clone();
  }
  o.grads = params.grads().clone();
  o.rngCounter = rng.counter();
  return o;
}

void expectSame(const Outcome& a, const Outcome& b) {
  EXPECT_TRUE(sameBits(a.grads, b.grads));
  EXPECT_TRUE(sameBits(a.output, b.output));
  EXPECT_EQ(a.inputGrad.defined(), b.inputGrad.defined());
  if (a.inputGrad.defined() && b.inputGrad.defined()) EXPECT_TRUE(sameBits(a.inputGrad, b.inputGrad));
  EXPECT_EQ(a.rngCounter, b.rngCounter);  // the recompute draws from a copy of the forward's Rng
}

// An MLP with dropout after each hidden layer: its masks come from Pass::rng.
std::unique_ptr<Sequential> mlpWithDropout() {
  auto s = std::make_unique<Sequential>();
  s->add(std::make_unique<Linear>(6, 16), "fc0").add(std::make_unique<Dropout>(0.5f), "drop0");
  s->add(gelu(), "gelu").add(std::make_unique<Linear>(16, 16), "fc1").add(std::make_unique<Dropout>(0.25f), "drop1");
  s->add(std::make_unique<Linear>(16, 3), "fc2");
  return s;
}

TEST(Recompute, WrappedSequentialWithDropoutGivesTheSameBits) {
  auto plain = mlpWithDropout();
  Recompute wrapped(mlpWithDropout());
  ParamBuffer p0, p1;
  bindParams(*plain, p0, 5);
  bindParams(wrapped, p1, 5);
  ASSERT_TRUE(sameBits(p0.values(), p1.values()));
  const std::vector<Tensor> inputs{randomTensor(Shape{4, 6}, 1), randomTensor(Shape{4, 6}, 2)};
  const Outcome a = train(*plain, p0, inputs, runtime::Rng(9));
  // Between forward and backward the wrapped module runs on other data with other masks, as a peer
  // that shares its buffers would (the GPT's blocks): only the recompute, with the masks replayed,
  // gives backward what the forward had.
  runtime::Rng other(99);
  const Outcome b = train(wrapped, p1, inputs, runtime::Rng(9), [&] {
    wrapped.inner().forward(randomTensor(Shape{4, 6}, 77), {.training = true, .rng = &other});
  });
  expectSame(a, b);
  EXPECT_EQ(wrapped.recomputations(), 2);  // once per training backward, not for the evaluation pass
  // The masks matter: another Rng gives other gradients, so the equality above is the replay's.
  const Outcome c = train(wrapped, p1, inputs, runtime::Rng(10));
  EXPECT_FALSE(sameBits(a.grads, c.grads));
}

// A wrapper inside a Sequential, next to layers that are not wrapped; its input gradient feeds them.
TEST(Recompute, WrappedLayerInsideASequentialGivesTheSameBits) {
  auto build = [](bool wrap) {
    auto s = std::make_unique<Sequential>();
    s->add(std::make_unique<Linear>(6, 6), "in");
    if (wrap)
      s->add(std::make_unique<Recompute>(mlpWithDropout()), "mlp");
    else
      s->add(mlpWithDropout(), "mlp");
    s->add(std::make_unique<Dropout>(0.5f), "drop").add(std::make_unique<Linear>(3, 2), "out");
    return s;
  };
  auto plain = build(false), wrapped = build(true);
  ParamBuffer p0, p1;
  bindParams(*plain, p0, 6);
  bindParams(*wrapped, p1, 6);
  const std::vector<Tensor> inputs{randomTensor(Shape{5, 6}, 3), randomTensor(Shape{5, 6}, 4)};
  auto& recompute = dynamic_cast<Recompute&>(wrapped->at(1));
  runtime::Rng other(98);
  expectSame(train(*plain, p0, inputs, runtime::Rng(11)), train(*wrapped, p1, inputs, runtime::Rng(11), [&] {
               recompute.inner().forward(randomTensor(Shape{5, 6}, 76), {.training = true, .rng = &other});
             }));
}

TEST(Recompute, MatchesFiniteDifferences) {
  Recompute wrapped(mlpWithDropout());
  ParamBuffer params;
  bindParams(wrapped, params, 7);
  checkModuleGradients(wrapped, params, randomTensor(Shape{3, 6}, 8));
}

// Recompute around a Sequential whose layers are units: the real forward tells the forward events,
// the recompute tells before-backward in forward order (in place of its before-forward), the wrapped
// backward only its after-backward events: each event once per unit.
TEST(Recompute, TellsEachUnitEventOnceBeforeBackwardBeforeTheRecompute) {
  auto inner = std::make_unique<Sequential>();
  inner->add(std::make_unique<Linear>(4, 5), "fc0").add(relu(), "relu");
  inner->add(std::make_unique<Linear>(5, 2), "fc1");
  Recompute wrapped(std::move(inner));
  ParamBuffer params;
  bindParams(wrapped, params, 3);
  UnitRecorder recorder;
  const Pass pass{.training = true, .units = &recorder};
  const Tensor& y = wrapped.forward(randomTensor(Shape{2, 4}, 1), pass);
  wrapped.backward(Tensor::zeros(y.shape()), pass);
  EXPECT_EQ(recorder.events,
            (std::vector<std::string>{"before-forward fc0", "after-forward fc0", "before-forward fc1",
                                      "after-forward fc1", "before-backward fc0", "before-backward fc1",
                                      "after-backward fc1", "after-backward fc0"}));
  EXPECT_EQ(wrapped.recomputations(), 1);
}

TEST(Recompute, ParsesItsModesAndRefusesOthers) {
  for (RecomputeMode m : {RecomputeMode::kNone, RecomputeMode::kSelective, RecomputeMode::kFull}) {
    EXPECT_EQ(parseRecompute(recomputeName(m)), m);
  }
  EXPECT_THROW(parseRecompute("some"), InvalidArgument);
  EXPECT_THROW(Recompute{ModulePtr()}, InvalidArgument);
}

// Three blocks: the second and third share the first's buffers (all of them with full, the
// recomputed ones with selective), which a wrong alias or a missed recompute would show here.
TEST(Recompute, GptGivesTheSameBitsInEveryMode) {
  const GptOptions base{.vocab = 13, .layers = 3, .heads = 2, .dim = 16, .context = 8};
  const std::vector<Tensor> inputs{randomTokenIds(2, 8, 13, 1), randomTokenIds(2, 8, 13, 2)};
  Outcome reference;
  for (RecomputeMode mode : {RecomputeMode::kNone, RecomputeMode::kSelective, RecomputeMode::kFull}) {
    SCOPED_TRACE(recomputeName(mode));
    GptOptions o = base;
    o.recompute = mode;
    Gpt gpt(o);
    ParamBuffer params;
    bindParams(gpt, params, 4);
    const Outcome got = train(gpt, params, inputs, runtime::Rng(3));
    if (mode == RecomputeMode::kNone)
      reference = got;
    else
      expectSame(reference, got);
    EXPECT_THROW(gpt.setRecompute(RecomputeMode::kNone), InvalidArgument);  // after a forward
  }
}

// The GPT's units hear the same events in the same order in every mode: a block's recomputed
// forward runs inside its backward, between the GPT's beforeBackward and afterBackward.
TEST(Recompute, GptTellsItsUnitsTheSameEventsInEveryMode) {
  std::vector<std::string> reference;
  for (RecomputeMode mode : {RecomputeMode::kNone, RecomputeMode::kSelective, RecomputeMode::kFull}) {
    SCOPED_TRACE(recomputeName(mode));
    Gpt gpt({.vocab = 13, .layers = 2, .heads = 2, .dim = 16, .context = 8, .recompute = mode});
    ParamBuffer params;
    bindParams(gpt, params, 4);
    UnitRecorder recorder;
    runtime::Rng rng(1);
    const Pass pass{.training = true, .rng = &rng, .units = &recorder};
    const Tensor& y = gpt.forward(randomTokenIds(2, 8, 13, 1), pass);
    gpt.backward(Tensor::zeros(y.shape()), pass);
    EXPECT_EQ(recorder.events.size(), 4u * 4u);  // embeddings, two blocks, ln_f: four events each
    if (mode == RecomputeMode::kNone)
      reference = recorder.events;
    else
      EXPECT_EQ(recorder.events, reference);
  }
}

}  // namespace
}  // namespace cohort::nn::testing
