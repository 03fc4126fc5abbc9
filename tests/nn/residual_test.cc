// Residual: gradients against finite differences, its parameter unit and the events of each unit at
// any nesting (inside a Sequential), shape errors, and accumulation.
#include "nn/residual.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "nn/activation.h"
#include "nn/grad_check.h"
#include "nn/linear.h"
#include "nn/sequential.h"
#include "runtime/error.h"
#include "tests/nn/grad_check.h"
#include "tests/nn/unit_recorder.h"
#include "tests/support/alloc_counter.h"

namespace cohort::nn {
namespace {

using testing::bindParams;
using testing::randomTensor;
using testing::UnitRecorder;
using Ranges = std::vector<std::pair<size_t, size_t>>;

ModulePtr mlpBlock(int64_t width) {
  auto block = std::make_unique<Sequential>();
  block->add(std::make_unique<Linear>(width, width), "fc0")
      .add(tanhActivation())
      .add(std::make_unique<Linear>(width, width), "fc1");
  return block;
}

TEST(Residual, AroundALinearMatchesFiniteDifferences) {
  Residual res(std::make_unique<Linear>(4, 4));
  ParamBuffer params;
  bindParams(res, params, 1);
  ASSERT_EQ(params.entries().size(), 2u);
  EXPECT_EQ(params.entries()[0].name, "f.weight");
  GradCheckResult r = checkGradients(res, params, randomTensor(Shape{3, 4}, 2));
  EXPECT_TRUE(r.ok) << r.summary();
  EXPECT_EQ(r.checked, 3 * 4 + 16 + 4 + 16 + 4);  // input, parameters, then the accumulation check
}

TEST(Residual, AroundASequentialMatchesFiniteDifferences) {
  Residual res(mlpBlock(5), "block");
  ParamBuffer params;
  bindParams(res, params, 3);
  EXPECT_EQ(params.entries()[0].name, "block.fc0.weight");
  EXPECT_EQ(params.entries()[3].name, "block.fc1.bias");
  GradCheckResult r = checkGradients(res, params, randomTensor(Shape{2, 5}, 4));
  EXPECT_TRUE(r.ok) << r.summary();
}

TEST(Residual, ForwardAddsTheInputAndBackwardAddsTheGradient) {
  Residual res(std::make_unique<Linear>(LinearOptions{.in = 2, .out = 2, .bias = false}));
  ParamBuffer params;
  bindParams(res, params, 1);
  float w[] = {1, 2, 3, 4};  // y = x + W x
  std::copy(w, w + 4, params.values().data());
  Tensor x = Tensor::zeros(Shape{1, 2});
  x.at(0) = 1;
  x.at(1) = -1;
  const Tensor& y = res.forward(x, Pass{});
  EXPECT_EQ(y.at(0), 1 + (1 - 2));
  EXPECT_EQ(y.at(1), -1 + (3 - 4));
  Tensor dy = Tensor::zeros(Shape{1, 2});
  dy.at(0) = 1;
  dy.at(1) = 2;
  const Tensor& dx = res.backward(dy, Pass{});  // dy + Wᵀ dy
  EXPECT_EQ(dx.at(0), 1 + (1 * 1 + 3 * 2));
  EXPECT_EQ(dx.at(1), 2 + (2 * 1 + 4 * 2));
  Pass noInput;
  noInput.needInputGrad = false;
  res.forward(x, noInput);
  EXPECT_FALSE(res.backward(dy, noInput).defined());
  EXPECT_EQ(params.grads().at(0), 1.0f);  // dW = dy xᵀ, written either way
  EXPECT_EQ(params.grads().at(3), -2.0f);
}

TEST(Residual, InsideASequentialIsPartOfItsLayersUnitAndEveryEntryIsReportedOnce) {
  // fc0, res0 = Residual(Sequential(fc0, tanh, fc1)), res1 = Residual(Linear), fc1: the
  // Sequential's units are its top-level layers, which win over the Residuals' and the inner
  // Sequential's own.
  Sequential net;
  net.add(std::make_unique<Linear>(3, 4), "fc0")
      .add(std::make_unique<Residual>(mlpBlock(4)), "res0")
      .add(std::make_unique<Residual>(std::make_unique<Linear>(4, 4)), "res1")
      .add(std::make_unique<Linear>(4, 2), "fc1");
  ParamBuffer params;
  bindParams(net, params, 5);
  const std::vector<std::string> names = {
      "fc0.weight",      "fc0.bias",      "res0.f.fc0.weight", "res0.f.fc0.bias", "res0.f.fc1.weight",
      "res0.f.fc1.bias", "res1.f.weight", "res1.f.bias",       "fc1.weight",      "fc1.bias"};
  ASSERT_EQ(params.entries().size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(params.entries()[i].name, names[i]);
  ASSERT_EQ(params.units().size(), 4u);
  for (const auto& u : params.units()) EXPECT_TRUE(u.declared) << u.name;

  for (bool needInputGrad : {false, true}) {
    UnitRecorder spy;
    Pass pass;
    pass.needInputGrad = needInputGrad;
    pass.units = &spy;
    net.forward(randomTensor(Shape{2, 3}, 6), pass);
    net.backward(randomTensor(Shape{2, 2}, 7), pass);
    const std::vector<std::string> forward = {"fc0", "res0", "res1", "fc1"};
    const std::vector<std::string> backward(forward.rbegin(), forward.rend());
    EXPECT_EQ(spy.unitsOf("before-forward"), forward);
    EXPECT_EQ(spy.unitsOf("after-forward"), forward);
    EXPECT_EQ(spy.unitsOf("before-backward"), backward);
    EXPECT_EQ(spy.unitsOf("after-backward"), backward);
    EXPECT_EQ(spy.events[0], "before-forward fc0");
    EXPECT_EQ(spy.events[1], "after-forward fc0");
    EXPECT_EQ(spy.events[8], "before-backward fc1");
    EXPECT_EQ(spy.events[9], "after-backward fc1");
    EXPECT_EQ(spy.afterBackwardEntries, (Ranges{{8, 10}, {6, 8}, {2, 6}, {0, 2}})) << "needInputGrad " << needInputGrad;
  }
}

TEST(Residual, AtTheTopDeclaresItsModuleAsOneUnit) {
  auto reported = [](Module& m) {
    UnitRecorder spy;
    Pass pass;
    pass.units = &spy;
    m.forward(randomTensor(Shape{2, 3}, 9), pass);
    m.backward(randomTensor(Shape{2, 3}, 10), pass);
    return spy.afterBackwardEntries;
  };
  Residual nested(std::make_unique<Residual>(std::make_unique<Linear>(3, 3)), "outer");
  ParamBuffer params;
  bindParams(nested, params, 8);
  EXPECT_EQ(params.entries()[0].name, "outer.f.weight");
  ASSERT_EQ(params.units().size(), 1u);
  EXPECT_EQ(params.units()[0].name, "outer");
  EXPECT_EQ(reported(nested), (Ranges{{0, 2}}));

  Residual aroundBlock(mlpBlock(3));  // the inner Sequential's units lose to the Residual's
  ParamBuffer blockParams;
  bindParams(aroundBlock, blockParams, 8);
  ASSERT_EQ(blockParams.units().size(), 1u);
  EXPECT_EQ(blockParams.units()[0].name, "f");
  EXPECT_EQ(reported(aroundBlock), (Ranges{{0, 4}}));
}

TEST(Residual, ShapeChangingModuleIsRefusedNamingBothShapes) {
  Residual res(std::make_unique<Linear>(4, 3));
  try {
    res.outputShape(Shape{2, 4});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("[2, 4]"), std::string::npos) << what;
    EXPECT_NE(what.find("[2, 3]"), std::string::npos) << what;
  }
  EXPECT_THROW(Residual(nullptr), InvalidArgument);
}

TEST(Residual, AccumulateGradsAddsToTheGradients) {
  Residual res(mlpBlock(3));
  ParamBuffer params;
  bindParams(res, params, 11);
  Tensor x = randomTensor(Shape{2, 3}, 12), dy = randomTensor(Shape{2, 3}, 13);
  res.forward(x, Pass{});
  Tensor dx = res.backward(dy, Pass{}).clone();
  Tensor once = params.grads().clone();
  Pass accumulate;
  accumulate.accumulateGrads = true;
  res.forward(x, accumulate);
  const Tensor& dx2 = res.backward(dy, accumulate);
  for (int64_t i = 0; i < once.numel(); ++i) EXPECT_FLOAT_EQ(params.grads().at(i), 2 * once.at(i)) << i;
  for (int64_t i = 0; i < dx.numel(); ++i) EXPECT_EQ(dx2.at(i), dx.at(i)) << "the input gradient is not accumulated";
}

TEST(Residual, SteadyStateAllocatesNothing) {
  Sequential net;
  net.add(std::make_unique<Residual>(mlpBlock(4)), "res0").add(std::make_unique<Linear>(4, 2), "fc0");
  ParamBuffer params;
  bindParams(net, params, 14);
  Tensor big = randomTensor(Shape{6, 4}, 15), small = randomTensor(Shape{3, 4}, 16);
  Tensor dyBig = randomTensor(Shape{6, 2}, 17), dySmall = randomTensor(Shape{3, 2}, 18);
  class Counter final : public UnitListener {  // allocates nothing, unlike UnitRecorder
   public:
    void afterBackward(const ParamBuffer::Unit& u) override { reported += u.endEntry - u.firstEntry; }
    size_t reported = 0;
  } counter;
  Pass pass;
  pass.units = &counter;
  net.forward(big, pass);
  net.backward(dyBig, pass);  // sizes every buffer for the largest batch
  long before = cohort::testing::allocationCount();
  for (int step = 0; step < 3; ++step) {
    net.forward(step % 2 ? small : big, pass);
    net.backward(step % 2 ? dySmall : dyBig, pass);
  }
  EXPECT_EQ(cohort::testing::allocationCount() - before, 0);
  EXPECT_EQ(counter.reported, 4 * params.entries().size());
}

}  // namespace
}  // namespace cohort::nn
