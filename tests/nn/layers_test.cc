// Finite-difference gradient checks for every layer and loss.
#include <gtest/gtest.h>

#include <cmath>

#include "nn/activation.h"
#include "nn/dropout.h"
#include "nn/gelu.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/sequential.h"
#include "nn/softmax.h"
#include "runtime/error.h"
#include "tests/nn/grad_check.h"

namespace cohort::nn {
namespace {

using testing::checkLossGradient;
using testing::checkModuleGradients;
using testing::GradCheckOptions;
using testing::randomTensor;

TEST(Linear, GradientsMatchFiniteDifferences) {
  Linear fc(5, 3);
  ParamBuffer params;
  fc.registerParams(params, "fc.");
  params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(1);
  fc.resetParams(rng);
  checkModuleGradients(fc, params, randomTensor(Shape{4, 5}, 2));
}

TEST(Linear, WithoutBiasInitialisesAndMatchesFiniteDifferences) {
  Linear fc(LinearOptions{.in = 5, .out = 3, .bias = false});
  ParamBuffer params;
  fc.registerParams(params, "fc.");
  ASSERT_EQ(params.entries().size(), 1u);
  params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(1);
  fc.resetParams(rng);
  checkModuleGradients(fc, params, randomTensor(Shape{4, 5}, 2));
}

// A GELU Linear is Linear then Gelu, bit for bit on the CPU (the same GEMM, bias loop and GELU
// code), and its gradients match finite differences.
TEST(Linear, WithGeluIsLinearThenGelu) {
  Linear fused(LinearOptions{.in = 6, .out = 4, .gelu = true});
  Sequential plain;
  plain.add(std::make_unique<Linear>(6, 4), "fc").add(gelu(), "gelu");
  ParamBuffer fusedParams, plainParams;
  fused.registerParams(fusedParams, "fc.");
  plain.registerParams(plainParams, "");
  fusedParams.allocate(runtime::cpuAllocator());
  plainParams.allocate(runtime::cpuAllocator());
  runtime::Rng rng(3);
  fused.resetParams(rng);
  plainParams.values().copyFrom(fusedParams.values());
  const Tensor x = randomTensor(Shape{5, 6}, 4, -2.0f, 2.0f), dy = randomTensor(Shape{5, 4}, 5);
  const Tensor& yf = fused.forward(x, Pass{});
  const Tensor& yp = plain.forward(x, Pass{});
  const Tensor& gf = fused.backward(dy, Pass{});
  const Tensor& gp = plain.backward(dy, Pass{});
  for (int64_t i = 0; i < yf.numel(); ++i) EXPECT_EQ(yf.at(i), yp.at(i)) << i;
  for (int64_t i = 0; i < gf.numel(); ++i) EXPECT_EQ(gf.at(i), gp.at(i)) << i;
  for (int64_t i = 0; i < fusedParams.numel(); ++i) EXPECT_EQ(fusedParams.grads().at(i), plainParams.grads().at(i)) << i;
  EXPECT_EQ(fused.name(), "Linear(6 -> 4, GELU)");
  checkModuleGradients(fused, fusedParams, randomTensor(Shape{3, 6}, 6));
}

// The next layer's backwardThroughGelu and the GELU Linear's backwardFromPreActivation (the fused
// path GPT's MLP takes) give what the two backward passes give.
TEST(Linear, BackwardThroughGeluEqualsTheTwoBackwards) {
  Linear fc(LinearOptions{.in = 5, .out = 8, .gelu = true}), proj(8, 3);
  ParamBuffer params;
  fc.registerParams(params, "fc.");
  proj.registerParams(params, "proj.");
  params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(7);
  fc.resetParams(rng);
  proj.resetParams(rng);
  const Tensor x = randomTensor(Shape{4, 5}, 8, -2.0f, 2.0f), dy = randomTensor(Shape{4, 3}, 9);
  proj.forward(fc.forward(x, Pass{}), Pass{});
  const Tensor separate = fc.backward(proj.backward(dy, Pass{}), Pass{}).clone();
  const Tensor separateGrads = params.grads().clone();
  const Tensor& fused = fc.backwardFromPreActivation(proj.backwardThroughGelu(dy, Pass{}, fc.preActivation()), Pass{});
  for (int64_t i = 0; i < fused.numel(); ++i) EXPECT_EQ(fused.at(i), separate.at(i)) << i;
  for (int64_t i = 0; i < params.numel(); ++i) EXPECT_EQ(params.grads().at(i), separateGrads.at(i)) << i;
}

TEST(Linear, ForwardMatchesHandComputation) {
  Linear fc(2, 2);
  ParamBuffer params;
  fc.registerParams(params, "");
  params.allocate(runtime::cpuAllocator());
  float w[] = {1, 2, 3, 4}, b[] = {0.5f, -1};
  std::copy(w, w + 4, fc.weight().data());
  std::copy(b, b + 2, fc.bias().data());
  Tensor x = Tensor::zeros(Shape{1, 2});
  x.at(0) = 1;
  x.at(1) = 2;
  const Tensor& y = fc.forward(x, Pass{});
  EXPECT_EQ(y.at(0), 1 * 1 + 2 * 2 + 0.5f);
  EXPECT_EQ(y.at(1), 3 * 1 + 4 * 2 - 1.0f);
}

TEST(Linear, DefaultInitIsPyTorchsUniformBound) {
  Linear fc(100, 50);
  ParamBuffer params;
  fc.registerParams(params, "");
  params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(3);
  fc.resetParams(rng);
  float bound = 0.1f, maxAbs = 0;
  for (int64_t i = 0; i < fc.weight().numel(); ++i) maxAbs = std::max(maxAbs, std::fabs(fc.weight().at(i)));
  EXPECT_LE(maxAbs, bound);
  EXPECT_GT(maxAbs, 0.9f * bound);
}

TEST(Activation, GradientsMatchFiniteDifferences) {
  for (ActivationKind kind : {ActivationKind::kRelu, ActivationKind::kTanh, ActivationKind::kSigmoid}) {
    Activation act(kind);
    ParamBuffer none;
    Tensor x = randomTensor(Shape{3, 7}, 4);
    // Keep ReLU inputs away from the kink at 0, where the derivative is undefined.
    for (int64_t i = 0; i < x.numel(); ++i) x.at(i) += x.at(i) >= 0 ? 0.1f : -0.1f;
    SCOPED_TRACE(act.name());
    checkModuleGradients(act, none, x, GradCheckOptions{.h = 1e-2f});
  }
}

TEST(Softmax, GradientsMatchFiniteDifferences) {
  for (bool log : {false, true}) {
    Softmax sm(log);
    ParamBuffer none;
    SCOPED_TRACE(sm.name());
    checkModuleGradients(sm, none, randomTensor(Shape{3, 5}, 6, -2, 2));
  }
}

TEST(Softmax, RowsSumToOne) {
  Softmax sm;
  Tensor x = randomTensor(Shape{4, 6}, 7, -30, 30);
  const Tensor& y = sm.forward(x, Pass{});
  for (int r = 0; r < 4; ++r) {
    double s = 0;
    for (int c = 0; c < 6; ++c) s += y.at(r * 6 + c);
    EXPECT_NEAR(s, 1.0, 1e-6);
  }
}

TEST(Dropout, GradientsMatchFiniteDifferencesWithAFixedMask) {
  Dropout d(0.3f);
  ParamBuffer none;
  checkModuleGradients(d, none, randomTensor(Shape{4, 8}, 8));
}

TEST(Dropout, ScalesKeptElementsAndIsIdentityInEval) {
  Dropout d(0.5f);
  Tensor x = Tensor::zeros(Shape{10000});
  x.fill(1.0f);
  runtime::Rng rng(1);
  Pass train;
  train.rng = &rng;
  const Tensor& y = d.forward(x, train);
  int kept = 0;
  for (int64_t i = 0; i < y.numel(); ++i) {
    ASSERT_TRUE(y.at(i) == 0.0f || y.at(i) == 2.0f);
    kept += y.at(i) != 0.0f;
  }
  EXPECT_NEAR(kept, 5000, 300);
  Pass eval;
  eval.training = false;
  EXPECT_EQ(d.forward(x, eval).data(), x.data());
  EXPECT_THROW(Dropout(1.0f), InvalidArgument);
}

TEST(Sequential, GradientsOfAnMlpMatchFiniteDifferences) {
  Sequential net;
  net.add(std::make_unique<Linear>(4, 6), "fc0").add(tanhActivation()).add(std::make_unique<Linear>(6, 3), "fc1");
  ParamBuffer params;
  net.registerParams(params, "");
  params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(10);
  net.resetParams(rng);
  EXPECT_EQ(params.entries()[0].name, "fc0.weight");
  EXPECT_EQ(params.entries()[3].name, "fc1.bias");
  checkModuleGradients(net, params, randomTensor(Shape{2, 4}, 11));
}

TEST(Sequential, ParameterFreePrefixGetsNoInputGradientRequest) {
  // Tanh before the first Linear: with needInputGrad false nothing below fc0 computes a gradient,
  // and the parameter gradients are the same as when the input gradient is asked for.
  Sequential net;
  net.add(tanhActivation()).add(std::make_unique<Linear>(4, 3), "fc0");
  ParamBuffer params;
  net.registerParams(params, "");
  params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(3);
  net.resetParams(rng);
  Tensor x = randomTensor(Shape{2, 4}, 4), dy = randomTensor(Shape{2, 3}, 5);
  Pass full, paramsOnly;
  paramsOnly.needInputGrad = false;
  net.forward(x, full);
  EXPECT_TRUE(net.backward(dy, full).defined());
  Tensor want = params.grads().clone();
  net.forward(x, paramsOnly);
  EXPECT_FALSE(net.backward(dy, paramsOnly).defined());
  for (int64_t i = 0; i < want.numel(); ++i) EXPECT_EQ(params.grads().at(i), want.at(i)) << i;
}

// A shape mistake names the layer by its name in the Sequential (the one its parameters carry), with
// the path through nested Sequentials; unnamed layers by their index. Still an InvalidArgument.
TEST(Sequential, ShapeErrorsNameTheLayer) {
  auto block = std::make_unique<Sequential>();
  block->add(std::make_unique<Linear>(16, 4), "fc0");
  Sequential net;
  net.add(std::make_unique<Linear>(10, 16), "fc0").add(std::make_unique<Linear>(16, 16)).add(std::move(block), "block1");
  ParamBuffer params;
  net.registerParams(params, "");
  params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(3);
  net.resetParams(rng);
  auto message = [](auto&& call) {
    try {
      call();
    } catch (const LayerError& e) {
      return std::string(e.what());
    }
    return std::string("nothing thrown");
  };
  Pass pass;
  EXPECT_EQ(message([&] { net.forward(randomTensor(Shape{32, 8}, 1), pass); }),
            "layer fc0: Linear(10 -> 16) got input of shape [32, 8]");
  EXPECT_EQ(message([&] { net.outputShape(Shape{32, 8}); }), "layer fc0: Linear(10 -> 16) got input of shape [32, 8]");
  EXPECT_EQ(net.outputShape(Shape{32, 10}).str(), "[32, 4]");

  Sequential wrong;  // the nested block's Linear takes 16, gets 5
  wrong.add(std::make_unique<Linear>(10, 5), "fc0").add(relu()).add(std::make_unique<Sequential>(), "empty");
  auto inner = std::make_unique<Sequential>();
  inner->add(std::make_unique<Linear>(16, 4), "fc0");
  wrong.add(std::move(inner), "block1");
  ParamBuffer wrongParams;
  wrong.registerParams(wrongParams, "");
  wrongParams.allocate(runtime::cpuAllocator());
  wrong.resetParams(rng);
  EXPECT_EQ(message([&] { wrong.forward(randomTensor(Shape{2, 10}, 2), pass); }),
            "layer block1.fc0: Linear(16 -> 4) got input of shape [2, 5]");
  EXPECT_EQ(message([&] { wrong.outputShape(Shape{2, 10}); }), "layer block1.fc0: Linear(16 -> 4) got input of shape [2, 5]");
  EXPECT_THROW(wrong.outputShape(Shape{2, 10}), InvalidArgument);

  Sequential unnamed;
  unnamed.add(std::make_unique<Linear>(3, 2));
  EXPECT_EQ(message([&] { unnamed.outputShape(Shape{1, 4}); }), "layer 0: Linear(3 -> 2) got input of shape [1, 4]");
}

TEST(SoftmaxCrossEntropy, GradientAndValue) {
  SoftmaxCrossEntropy ce;
  Tensor logits = randomTensor(Shape{4, 5}, 12, -2, 2);
  Tensor targets = Tensor::zeros(Shape{4});
  float labels[] = {0, 4, 2, 2};
  std::copy(labels, labels + 4, targets.data());
  checkLossGradient(ce, logits, targets);
  // Value against a direct computation.
  double expect = 0;
  for (int r = 0; r < 4; ++r) {
    double s = 0;
    for (int c = 0; c < 5; ++c) s += std::exp(static_cast<double>(logits.at(r * 5 + c)));
    expect += std::log(s) - logits.at(r * 5 + static_cast<int>(labels[r]));
  }
  EXPECT_NEAR(ce.forward(logits, targets), expect / 4, 1e-5);
  targets.at(1) = 5;
  EXPECT_THROW(ce.forward(logits, targets), InvalidArgument);
  targets.at(1) = 1.5f;
  EXPECT_THROW(ce.forward(logits, targets), InvalidArgument);
}

TEST(SoftmaxCrossEntropy, CountsCorrectPredictions) {
  SoftmaxCrossEntropy ce;
  Tensor logits = Tensor::zeros(Shape{3, 3});
  float v[] = {5, 0, 0, 0, 5, 0, 0, 0, 5};
  std::copy(v, v + 9, logits.data());
  Tensor targets = Tensor::zeros(Shape{3});
  targets.at(0) = 0;
  targets.at(1) = 1;
  targets.at(2) = 0;
  ce.forward(logits, targets);
  EXPECT_EQ(ce.correct(), 2);
}

// A sequence: logits [B, T, C] and targets [B, T] are B·T predictions, the loss their mean (per
// token), exactly the rows of the same logits seen as [B·T, C]; positions() is T.
TEST(SoftmaxCrossEntropy, SequencesArePredictionsPerPosition) {
  SoftmaxCrossEntropy seq, flat;
  Tensor logits = randomTensor(Shape{2, 3, 5}, 13, -2, 2);
  Tensor targets = Tensor::zeros(Shape{2, 3});
  float labels[] = {0, 4, 2, 2, 1, 3};
  std::copy(labels, labels + 6, targets.data());
  const float l = seq.forward(logits, targets);
  Tensor rows = Tensor::zeros(Shape{6, 5}), rowTargets = Tensor::zeros(Shape{6});
  rows.copyFrom(logits);
  rowTargets.copyFrom(targets);
  EXPECT_EQ(l, flat.forward(rows, rowTargets));
  EXPECT_EQ(seq.correct(), flat.correct());
  EXPECT_EQ(seq.positions(), 3);
  EXPECT_EQ(flat.positions(), 1);
  ASSERT_EQ(seq.backward().shape(), logits.shape());
  for (int64_t i = 0; i < logits.numel(); ++i) EXPECT_EQ(seq.backward().at(i), flat.backward().at(i)) << i;
  checkLossGradient(seq, logits, targets);
  // Targets that do not match the logits' leading dimensions are refused, naming both shapes.
  try {
    seq.forward(logits, Tensor::zeros(Shape{3, 2}));
    ADD_FAILURE() << "[3, 2] targets for [2, 3, 5] logits were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3, 5]"), std::string::npos) << e.what();
  }
}

TEST(MeanSquaredError, GradientAndValue) {
  MeanSquaredError mse;
  Tensor out = randomTensor(Shape{3, 2}, 13);
  Tensor targets = randomTensor(Shape{3, 2}, 14);
  checkLossGradient(mse, out, targets);
  double expect = 0;
  for (int i = 0; i < 6; ++i) expect += std::pow(out.at(i) - targets.at(i), 2);
  EXPECT_NEAR(mse.forward(out, targets), expect / 6, 1e-6);
  EXPECT_THROW(mse.forward(out, Tensor::zeros(Shape{5})), InvalidArgument);
}

}  // namespace
}  // namespace cohort::nn
