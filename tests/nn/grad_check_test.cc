// The public gradient check (nn/grad_check.h) on user-defined layers: a correct one passes, and
// each kind of wrong backward fails with the wrong tensor named.
#include "nn/grad_check.h"

#include <gtest/gtest.h>

#include <string>

#include "nn/linear.h"
#include "nn/loss.h"
#include "runtime/error.h"
#include "tests/nn/grad_check.h"

namespace cohort::nn {
namespace {

// How a Scale layer's backward goes wrong.
enum class Bug {
  kNone,
  kInputGradMissesFactor,  // dx = dy instead of a·dy
  kParamGradMissesHalf,    // da = Σ dy·x / 2
  kAddsToStaleGrad,        // da += ... even without Pass::accumulateGrads
  kIgnoresAccumulate,      // da = ... even with Pass::accumulateGrads
  kNoInputGrad,            // returns an undefined tensor although asked for one
};

// y = a·x with one parameter a: the example of nn/module.h, with bugs to order.
class Scale final : public Module {
 public:
  explicit Scale(Bug bug = Bug::kNone) : bug_(bug) {}
  std::string name() const override { return "Scale"; }
  void registerParams(ParamBuffer& params, const std::string& prefix) override {
    params.add(prefix + "a", Shape{1}, &a_, &aGrad_);
  }
  void resetParams(runtime::Rng&) override { a_.at(0) = 1.5f; }
  Shape outputShape(const Shape& input) const override { return input; }
  const Tensor& forward(const Tensor& x, const Pass&) override {
    x_ = x;
    runtime::ensureShape(y_, x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) y_.at(i) = a_.at(0) * x.at(i);
    return y_;
  }
  const Tensor& backward(const Tensor& dy, const Pass& pass) override {
    double da = 0;
    for (int64_t i = 0; i < dy.numel(); ++i) da += static_cast<double>(dy.at(i)) * x_.at(i);
    if (bug_ == Bug::kParamGradMissesHalf) da /= 2;
    const bool add = bug_ == Bug::kAddsToStaleGrad || (pass.accumulateGrads && bug_ != Bug::kIgnoresAccumulate);
    aGrad_.at(0) = static_cast<float>(da) + (add ? aGrad_.at(0) : 0.0f);
    if (!pass.needInputGrad || bug_ == Bug::kNoInputGrad) return dx_ = Tensor();
    runtime::ensureShape(dx_, x_.shape());
    const float factor = bug_ == Bug::kInputGradMissesFactor ? 1.0f : a_.at(0);
    for (int64_t i = 0; i < dy.numel(); ++i) dx_.at(i) = factor * dy.at(i);
    return dx_;
  }

 private:
  Bug bug_;
  Tensor a_, aGrad_, x_, y_, dx_;
};

using testing::randomTensor;

// Registers m's parameters under `prefix`, binds them and initialises them.
void bind(Module& m, ParamBuffer& params, const std::string& prefix) {
  m.registerParams(params, prefix);
  params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(1);
  m.resetParams(rng);
}

GradCheckResult checkScale(Bug bug, const GradCheckOptions& options = {}) {
  Scale layer(bug);
  ParamBuffer params;
  bind(layer, params, "scale.");
  return checkGradients(layer, params, randomTensor(Shape{3, 4}, 2), options);
}

TEST(GradCheck, ACorrectUserLayerPasses) {
  GradCheckResult r = checkScale(Bug::kNone);
  EXPECT_TRUE(r.ok) << r.summary();
  EXPECT_EQ(r.checked, 12 + 1 + 1);  // input, a, a accumulated
  EXPECT_EQ(r.failed, 0);
  EXPECT_TRUE(r.failures.empty());
  EXPECT_LT(r.worstError, 1e-3);
  EXPECT_EQ(r.summary().rfind("gradient check passed: 14 elements", 0), 0u) << r.summary();
}

TEST(GradCheck, AWrongInputGradientFailsNamingTheInput) {
  GradCheckResult r = checkScale(Bug::kInputGradMissesFactor);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.worstWhere.rfind("input[", 0), 0u) << r.worstWhere;
  EXPECT_EQ(r.failed, 12) << r.summary();
  EXPECT_EQ(r.failures.size(), 8u) << "only the first few are kept";
  EXPECT_NE(r.summary().find("numeric"), std::string::npos) << r.summary();
  EXPECT_NE(r.summary().find("... and 4 more"), std::string::npos) << r.summary();
  EXPECT_EQ(r.summary().find("scale.a"), std::string::npos) << "the parameter gradient is right";
}

TEST(GradCheck, AWrongParameterGradientFailsNamingTheParameter) {
  GradCheckResult r = checkScale(Bug::kParamGradMissesHalf);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.worstWhere, "scale.a[0]");
  ASSERT_FALSE(r.failures.empty());
  EXPECT_EQ(r.failures[0].rfind("scale.a[0]: numeric ", 0), 0u) << r.failures[0];
  EXPECT_EQ(r.summary().find("input["), std::string::npos) << r.summary();
}

TEST(GradCheck, ABackwardThatAddsToStaleGradientsFails) {
  GradCheckResult r = checkScale(Bug::kAddsToStaleGrad);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.worstWhere, "scale.a[0]") << r.summary();
}

TEST(GradCheck, ABackwardThatIgnoresAccumulateGradsFails) {
  GradCheckResult r = checkScale(Bug::kIgnoresAccumulate);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failed, 1) << r.summary();
  EXPECT_NE(r.summary().find("scale.a[0]: a second backward with Pass::accumulateGrads"), std::string::npos)
      << r.summary();
  EXPECT_TRUE(checkScale(Bug::kIgnoresAccumulate, {.checkAccumulate = false}).ok);
}

TEST(GradCheck, AMissingInputGradientFails) {
  GradCheckResult r = checkScale(Bug::kNoInputGrad);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.worstWhere, "input");
  EXPECT_NE(r.summary().find("no input gradient"), std::string::npos) << r.summary();
  EXPECT_TRUE(checkScale(Bug::kNoInputGrad, {.checkInput = false}).ok);
}

TEST(GradCheck, MaxPerTensorSpreadsFewerChecks) {
  Linear fc(6, 5);
  ParamBuffer params;
  bind(fc, params, "fc.");
  Tensor x = randomTensor(Shape{4, 6}, 4);
  Tensor before = x.clone();
  GradCheckResult r = checkGradients(fc, params, x, {.maxPerTensor = 3, .checkAccumulate = false});
  EXPECT_TRUE(r.ok) << r.summary();
  EXPECT_EQ(r.checked, 3 + 3 + 3);  // input, fc.weight, fc.bias
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_EQ(x.at(i), before.at(i)) << "the caller's input is untouched";
}

TEST(GradCheck, RefusesUnboundParameters) {
  Scale layer;
  ParamBuffer params;
  layer.registerParams(params, "");
  EXPECT_THROW(checkGradients(layer, params, randomTensor(Shape{2}, 1)), InvalidArgument);
}

// A loss whose gradient forgets the 1/n of its mean.
class SumLossWithMeanGrad final : public Loss {
 public:
  std::string name() const override { return "Broken"; }
  float forward(const Tensor& output, const Tensor&) override {
    runtime::ensureShape(grad_, output.shape());
    double s = 0;
    for (int64_t i = 0; i < output.numel(); ++i) s += output.at(i);
    grad_.fill(1.0f);
    return static_cast<float>(s / static_cast<double>(output.numel()));
  }
  const Tensor& backward() override { return grad_; }

 private:
  Tensor grad_;
};

TEST(GradCheck, LossesPassOrFailNamingTheOutput) {
  MeanSquaredError mse;
  GradCheckResult good = checkGradients(mse, randomTensor(Shape{3, 2}, 5), randomTensor(Shape{3, 2}, 6));
  EXPECT_TRUE(good.ok) << good.summary();
  EXPECT_EQ(good.checked, 6);
  SumLossWithMeanGrad broken;
  GradCheckResult bad = checkGradients(broken, randomTensor(Shape{4}, 7), Tensor::zeros(Shape{4}));
  EXPECT_FALSE(bad.ok);
  EXPECT_EQ(bad.worstWhere.rfind("output[", 0), 0u) << bad.summary();
  EXPECT_EQ(bad.failed, 4);
}

}  // namespace
}  // namespace cohort::nn
