// BatchNorm2d: finite-difference gradients in training and evaluation mode, the running statistics
// against hand-computed values, and its buffers in the ParamBuffer.
#include "nn/batchnorm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "runtime/error.h"
#include "tests/nn/grad_check.h"

namespace cohort::nn {
namespace {

using testing::bindParams;
using testing::checkModuleGradients;
using testing::GradCheckOptions;
using testing::randomTensor;

// [N = 2, C = 2, H = 1, W = 2]: channel 0 holds {1, 2, 3, 6} (mean 3, biased variance 3.5,
// unbiased 14/3), channel 1 holds {-1, -1, 1, 1} (mean 0, biased variance 1, unbiased 4/3).
Tensor handInput() {
  Tensor x = Tensor::zeros(Shape{2, 2, 1, 2});
  const float v[] = {1, 2, -1, -1, 3, 6, 1, 1};
  std::copy(v, v + 8, x.data());
  return x;
}

TEST(BatchNorm2d, RegistersParametersAndBuffers) {
  BatchNorm2d bn(3);
  ParamBuffer params;
  bn.registerParams(params, "bn0.");
  ASSERT_EQ(params.entries().size(), 2u);
  EXPECT_EQ(params.entries()[0].name, "bn0.weight");
  EXPECT_EQ(params.entries()[1].name, "bn0.bias");
  ASSERT_EQ(params.bufferEntries().size(), 2u);
  EXPECT_EQ(params.bufferEntries()[0].name, "bn0.running_mean");
  EXPECT_EQ(params.bufferEntries()[1].name, "bn0.running_var");
  params.allocate(runtime::cpuAllocator());
  // Binding alone gives the buffers their initial values; resetParams sets the parameters.
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(bn.runningMean().at(c), 0.0f);
    EXPECT_EQ(bn.runningVar().at(c), 1.0f);
  }
  runtime::Rng rng(1);
  bn.resetParams(rng);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(bn.weight().at(c), 1.0f);
    EXPECT_EQ(bn.bias().at(c), 0.0f);
  }
}

TEST(BatchNorm2d, TrainingNormalisesWithBatchStatisticsAndUpdatesRunningOnes) {
  BatchNorm2d bn(2);
  ParamBuffer params;
  bindParams(bn, params, 1);
  Tensor x = handInput();
  const Tensor& y = bn.forward(x, Pass{});
  const double inv0 = 1 / std::sqrt(3.5 + 1e-5), inv1 = 1 / std::sqrt(1 + 1e-5);
  const double want[] = {-2 * inv0, -1 * inv0, -inv1, -inv1, 0, 3 * inv0, inv1, inv1};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(y.at(i), want[i], 1e-6) << i;
  EXPECT_NEAR(bn.runningMean().at(0), 0.3, 1e-7);
  EXPECT_NEAR(bn.runningMean().at(1), 0.0, 1e-7);
  EXPECT_NEAR(bn.runningVar().at(0), 0.9 + 0.1 * 14.0 / 3.0, 1e-6);
  EXPECT_NEAR(bn.runningVar().at(1), 0.9 + 0.1 * 4.0 / 3.0, 1e-6);
  bn.forward(x, Pass{});  // a second step moves them another 10% of the way
  EXPECT_NEAR(bn.runningMean().at(0), 0.9 * 0.3 + 0.3, 1e-6);
  EXPECT_NEAR(bn.runningVar().at(0), 0.9 * (0.9 + 0.1 * 14.0 / 3.0) + 0.1 * 14.0 / 3.0, 1e-6);
}

TEST(BatchNorm2d, EvaluationUsesTheRunningStatistics) {
  BatchNorm2d bn(2, 1e-5, 0.5);
  ParamBuffer params;
  bindParams(bn, params, 1);
  bn.weight().at(0) = 2;
  bn.weight().at(1) = 0.5f;
  bn.bias().at(0) = 1;
  bn.bias().at(1) = -1;
  Tensor x = handInput();
  bn.forward(x, Pass{});  // running: mean {1.5, 0}, var {0.5 + 0.5 · 14/3, 0.5 + 0.5 · 4/3}
  const double mean[] = {1.5, 0}, var[] = {0.5 + 7.0 / 3.0, 0.5 + 2.0 / 3.0}, w[] = {2, 0.5}, b[] = {1, -1};
  Pass eval;
  eval.training = false;
  const Tensor& y = bn.forward(x, eval);
  for (int i = 0; i < 8; ++i) {
    const int c = (i / 2) % 2;
    EXPECT_NEAR(y.at(i), (x.at(i) - mean[c]) / std::sqrt(var[c] + 1e-5) * w[c] + b[c], 1e-5) << i;
  }
  EXPECT_NEAR(bn.runningMean().at(0), 1.5, 1e-7);  // evaluation leaves them alone
  // A single value per channel is fine in evaluation, refused in training (as PyTorch).
  Tensor one = randomTensor(Shape{1, 2, 1, 1}, 2);
  EXPECT_NO_THROW(bn.forward(one, eval));
  EXPECT_THROW(bn.forward(one, Pass{}), InvalidArgument);
}

TEST(BatchNorm2d, GradientsMatchFiniteDifferencesInTraining) {
  BatchNorm2d bn(3);
  ParamBuffer params;
  bindParams(bn, params, 1);
  Tensor affine = randomTensor(Shape{6}, 3, 0.5f, 1.5f);
  for (int c = 0; c < 3; ++c) {
    bn.weight().at(c) = affine.at(c);
    bn.bias().at(c) = affine.at(3 + c) - 1.0f;
  }
  checkModuleGradients(bn, params, randomTensor(Shape{2, 3, 3, 2}, 4, -2, 2), GradCheckOptions{.h = 1e-2f});
}

TEST(BatchNorm2d, GradientsMatchFiniteDifferencesInEvaluation) {
  BatchNorm2d bn(3);
  ParamBuffer params;
  bindParams(bn, params, 1);
  bn.forward(randomTensor(Shape{4, 3, 2, 2}, 5, -3, 3), Pass{});  // running statistics away from 0 and 1
  bn.weight().at(1) = -0.7f;
  checkModuleGradients(bn, params, randomTensor(Shape{2, 3, 2, 3}, 6), GradCheckOptions{.training = false});
}

TEST(BatchNorm2d, AccumulatesParameterGradients) {
  BatchNorm2d bn(2);
  ParamBuffer params;
  bindParams(bn, params, 1);
  Tensor x = randomTensor(Shape{2, 2, 2, 2}, 7);
  Tensor dy = randomTensor(Shape{2, 2, 2, 2}, 8);
  bn.forward(x, Pass{});
  bn.backward(dy, Pass{});
  Tensor once = params.grads().clone();
  Pass accumulate;
  accumulate.accumulateGrads = true;
  accumulate.needInputGrad = false;
  bn.forward(x, accumulate);
  EXPECT_FALSE(bn.backward(dy, accumulate).defined());
  for (int64_t i = 0; i < once.numel(); ++i) EXPECT_NEAR(params.grads().at(i), 2 * once.at(i), 1e-5) << i;
}

TEST(BatchNorm2d, RefusesBadArguments) {
  EXPECT_THROW(BatchNorm2d(0), InvalidArgument);
  EXPECT_THROW(BatchNorm2d(2, 0.0), InvalidArgument);
  EXPECT_THROW(BatchNorm2d(2, 1e-5, 1.5), InvalidArgument);
  EXPECT_THROW(BatchNorm2d(2).outputShape(Shape{1, 3, 2, 2}), InvalidArgument);
  EXPECT_THROW(BatchNorm2d(2).outputShape(Shape{1, 2}), InvalidArgument);
}

}  // namespace
}  // namespace cohort::nn
