// Gelu and LayerNorm (the transformer layers of issue 20) on the CPU: values against closed-form and
// hand-computed references, finite-difference gradients for the input and the parameters over
// several shapes (one feature, odd sizes, any leading dimensions), per-row statistics, buffer reuse
// and the errors for bad arguments. The GPU paths are compared with these in
// tests/nn/gpu/gpu_norm_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "nn/gelu.h"
#include "nn/layer_norm.h"
#include "runtime/error.h"
#include "tests/nn/grad_check.h"

namespace cohort::nn {
namespace {

using testing::bindParams;
using testing::checkModuleGradients;
using testing::GradCheckOptions;
using testing::randomTensor;

// The tanh approximation in double, as written in PyTorch's documentation.
double geluReference(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

Tensor fromValues(const Shape& shape, std::initializer_list<float> values) {
  Tensor t = Tensor::zeros(shape);
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel());
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

// ---- Gelu ----

TEST(Gelu, MatchesTheTanhApproximation) {
  Gelu gelu;
  // torch.nn.functional.gelu(x, approximate='tanh') at these points, to double precision.
  Tensor x = fromValues(Shape{2, 4}, {0.0f, 0.5f, 1.0f, -1.0f, 2.0f, -2.0f, 3.0f, -3.0f});
  const double want[] = {0.0,
                         0.34571400982514394,
                         0.8411919906082768,
                         -0.15880800939172324,
                         1.954597694087775,
                         -0.04540230591222494,
                         2.996362607918227,
                         -0.0036373920817729943};
  const Tensor& y = gelu.forward(x, Pass{});
  ASSERT_EQ(y.shape(), x.shape());
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(y.at(i), want[i], 1e-6) << "x = " << x.at(i);
  // Far from 0 it is the identity on the right and 0 on the left.
  Tensor tails = fromValues(Shape{4}, {10.0f, 30.0f, -10.0f, -30.0f});
  const Tensor& t = gelu.forward(tails, Pass{});
  EXPECT_EQ(t.at(0), 10.0f);
  EXPECT_EQ(t.at(1), 30.0f);
  EXPECT_EQ(t.at(2), 0.0f);
  EXPECT_EQ(t.at(3), 0.0f);
  // Against the double formula over a range of inputs.
  Tensor r = randomTensor(Shape{3, 5, 7}, 1, -6.0f, 6.0f);
  const Tensor& yr = gelu.forward(r, Pass{});
  for (int64_t i = 0; i < r.numel(); ++i) EXPECT_NEAR(yr.at(i), geluReference(r.at(i)), 2e-6) << r.at(i);
}

TEST(Gelu, DerivativeMatchesClosedForm) {
  Gelu gelu;
  Tensor x = fromValues(Shape{5}, {0.0f, 1.0f, -1.5f, 20.0f, -20.0f});
  Tensor dy = fromValues(Shape{5}, {1.0f, 1.0f, 2.0f, 1.0f, 1.0f});
  gelu.forward(x, Pass{});
  const Tensor& dx = gelu.backward(dy, Pass{});
  EXPECT_EQ(dx.at(0), 0.5f);  // gelu'(0) = 1/2 exactly
  // gelu'(x) by the derivative of the double formula, tanh' = 1 − tanh².
  auto derivative = [](double v) {
    const double k = std::sqrt(2.0 / M_PI), t = std::tanh(k * (v + 0.044715 * v * v * v));
    return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v);
  };
  EXPECT_NEAR(dx.at(1), derivative(1.0), 1e-6);
  EXPECT_NEAR(dx.at(2), 2 * derivative(-1.5), 1e-6);
  EXPECT_EQ(dx.at(3), 1.0f);
  EXPECT_EQ(dx.at(4), 0.0f);
}

TEST(Gelu, GradientsMatchFiniteDifferences) {
  uint64_t seed = 10;
  for (const Shape& shape : {Shape{1}, Shape{7}, Shape{3, 5}, Shape{2, 3, 7}, Shape{4, 1, 9}}) {
    SCOPED_TRACE(shape.str());
    Gelu gelu;
    ParamBuffer none;
    checkModuleGradients(gelu, none, randomTensor(shape, ++seed, -3.0f, 3.0f), GradCheckOptions{.h = 1e-3f});
  }
}

TEST(Gelu, ReusesItsBuffersAndSkipsTheInputGradient) {
  Gelu gelu;
  Tensor x = randomTensor(Shape{4, 6}, 2);
  const float* out = gelu.forward(x, Pass{}).data();
  const float* grad = gelu.backward(x, Pass{}).data();
  EXPECT_EQ(gelu.forward(x, Pass{}).data(), out);
  EXPECT_EQ(gelu.backward(x, Pass{}).data(), grad);
  Pass noInput;
  noInput.needInputGrad = false;
  gelu.forward(x, noInput);
  EXPECT_FALSE(gelu.backward(x, noInput).defined());
}

// ---- LayerNorm ----

TEST(LayerNorm, RegistersWeightAndBias) {
  LayerNorm ln(5);
  ParamBuffer params;
  ln.registerParams(params, "ln_1.");
  ASSERT_EQ(params.entries().size(), 2u);
  EXPECT_EQ(params.entries()[0].name, "ln_1.weight");
  EXPECT_EQ(params.entries()[1].name, "ln_1.bias");
  EXPECT_EQ(params.entries()[0].numel, 5u);
  EXPECT_EQ(params.entries()[1].numel, 5u);
  EXPECT_TRUE(params.bufferEntries().empty());
  params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(1);
  ln.resetParams(rng);
  for (int c = 0; c < 5; ++c) {
    EXPECT_EQ(ln.weight().at(c), 1.0f);
    EXPECT_EQ(ln.bias().at(c), 0.0f);
  }
}

// Rows {1, 2, 3, 6} (mean 3, biased variance 3.5) and {-1, -1, 1, 1} (mean 0, variance 1).
TEST(LayerNorm, MatchesHandComputedValues) {
  LayerNorm ln(4);
  ParamBuffer params;
  bindParams(ln, params, 1);
  const float w[] = {2.0f, 0.5f, -1.0f, 1.0f}, b[] = {1.0f, 0.0f, -2.0f, 0.25f};
  for (int c = 0; c < 4; ++c) ln.weight().at(c) = w[c], ln.bias().at(c) = b[c];
  Tensor x = fromValues(Shape{2, 4}, {1, 2, 3, 6, -1, -1, 1, 1});
  const Tensor& y = ln.forward(x, Pass{});
  ASSERT_EQ(y.shape(), x.shape());
  const double mean[] = {3, 0}, inv[] = {1 / std::sqrt(3.5 + 1e-5), 1 / std::sqrt(1 + 1e-5)};
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ln.mean().at(r), static_cast<float>(mean[r]));
    EXPECT_NEAR(ln.rstd().at(r), inv[r], 1e-7);
    for (int c = 0; c < 4; ++c) {
      EXPECT_NEAR(y.at(r * 4 + c), w[c] * (x.at(r * 4 + c) - mean[r]) * inv[r] + b[c], 1e-6) << r << ", " << c;
    }
  }
  // An eps of 1 changes the scale: 1 / sqrt(3.5 + 1).
  LayerNorm wide(4, 1.0);
  ParamBuffer wideParams;
  bindParams(wide, wideParams, 1);
  EXPECT_NEAR(wide.forward(x, Pass{}).at(3), 3 / std::sqrt(4.5), 1e-6);
}

TEST(LayerNorm, EveryRowHasMeanZeroAndVarianceOneBeforeTheAffine) {
  const int64_t d = 67;
  LayerNorm ln(d);
  ParamBuffer params;
  bindParams(ln, params, 1);  // weight 1, bias 0: the output is xhat
  Tensor x = randomTensor(Shape{3, 5, d}, 3, -4.0f, 6.0f);
  for (int64_t i = 0; i < x.numel(); ++i) x.at(i) = x.at(i) * static_cast<float>(1 + i / d) + 0.5f * (i / d);
  const Tensor y = ln.forward(x, Pass{}).clone();
  ASSERT_EQ(y.shape(), x.shape());
  ASSERT_EQ(ln.mean().numel(), 15);
  for (int64_t r = 0; r < 15; ++r) {
    double sum = 0, sq = 0, xs = 0;
    for (int64_t c = 0; c < d; ++c) sum += y.at(r * d + c), xs += x.at(r * d + c);
    for (int64_t c = 0; c < d; ++c) sq += (y.at(r * d + c) - sum / d) * (y.at(r * d + c) - sum / d);
    EXPECT_NEAR(sum / d, 0.0, 1e-6) << "row " << r;
    EXPECT_NEAR(sq / d, 1.0, 1e-4) << "row " << r;  // var / (var + eps), var of order 10
    EXPECT_NEAR(ln.mean().at(r), xs / d, 1e-5 * (1 + r)) << "row " << r;
  }
  // Leading dimensions only count rows: the same data as [15, d] gives the same bits.
  const Tensor& flat = ln.forward(x.reshape(Shape{15, d}), Pass{});
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(flat.at(i), y.at(i)) << i;
}

TEST(LayerNorm, OneFeatureGivesTheBias) {
  LayerNorm ln(1);
  ParamBuffer params;
  bindParams(ln, params, 1);
  ln.weight().at(0) = 3.0f;
  ln.bias().at(0) = -0.75f;
  Tensor x = fromValues(Shape{3, 1}, {2.0f, -5.0f, 0.0f});
  const Tensor& y = ln.forward(x, Pass{});
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(y.at(r), -0.75f);
    EXPECT_EQ(ln.mean().at(r), x.at(r));
    EXPECT_NEAR(ln.rstd().at(r), 1 / std::sqrt(1e-5), 1e-2);
  }
  // xhat is 0 everywhere: no gradient reaches the input or the weight; the bias gets Σ dy.
  Tensor dy = fromValues(Shape{3, 1}, {1.0f, 2.0f, 4.0f});
  const Tensor& dx = ln.backward(dy, Pass{});
  for (int r = 0; r < 3; ++r) EXPECT_EQ(dx.at(r), 0.0f);
  EXPECT_EQ(params.grads().at(params.entries()[0].offset), 0.0f);
  EXPECT_EQ(params.grads().at(params.entries()[1].offset), 7.0f);
}

TEST(LayerNorm, GradientsMatchFiniteDifferences) {
  uint64_t seed = 20;
  for (const Shape& shape : {Shape{4, 5}, Shape{2, 3, 7}, Shape{3, 1}, Shape{1, 9}, Shape{6}, Shape{2, 2, 1, 13}}) {
    SCOPED_TRACE(shape.str());
    const int64_t d = shape[shape.rank() - 1];
    LayerNorm ln(d);
    ParamBuffer params;
    bindParams(ln, params, 1);
    // Off their defaults so every parameter matters.
    Tensor affine = randomTensor(Shape{2 * d}, ++seed, -1.5f, 1.5f);
    for (int64_t c = 0; c < d; ++c) ln.weight().at(c) = affine.at(c), ln.bias().at(c) = affine.at(d + c);
    checkModuleGradients(ln, params, randomTensor(shape, ++seed, -2.0f, 2.0f), GradCheckOptions{.h = 1e-3f});
    // Evaluation computes the same thing.
    checkModuleGradients(ln, params, randomTensor(shape, ++seed, -2.0f, 2.0f),
                         GradCheckOptions{.h = 1e-3f, .training = false});
  }
}

TEST(LayerNorm, SkipsTheInputGradientAndAccumulates) {
  LayerNorm ln(6);
  ParamBuffer params;
  bindParams(ln, params, 1);
  Tensor x = randomTensor(Shape{4, 6}, 7);
  Tensor dy = randomTensor(Shape{4, 6}, 8);
  ln.forward(x, Pass{});
  ln.backward(dy, Pass{});
  Tensor once = params.grads().clone();
  Pass accumulate;
  accumulate.accumulateGrads = true;
  accumulate.needInputGrad = false;
  ln.forward(x, accumulate);
  EXPECT_FALSE(ln.backward(dy, accumulate).defined());
  for (int64_t i = 0; i < once.numel(); ++i) EXPECT_NEAR(params.grads().at(i), 2 * once.at(i), 1e-5) << i;
  // A batch no larger than before reuses every buffer.
  const float* outData = ln.forward(x, Pass{}).data();
  const float* dxData = ln.backward(dy, Pass{}).data();
  EXPECT_EQ(ln.forward(x.narrowRows(0, 3), Pass{}).data(), outData);
  EXPECT_EQ(ln.backward(dy.narrowRows(0, 3), Pass{}).data(), dxData);
  EXPECT_EQ(ln.forward(x, Pass{}).data(), outData);
}

TEST(LayerNorm, NoRowsGivesZeroGradients) {
  LayerNorm ln(3);
  ParamBuffer params;
  bindParams(ln, params, 1);
  params.grads().fill(5.0f);
  Tensor x = Tensor::zeros(Shape{0, 3});
  EXPECT_EQ(ln.forward(x, Pass{}).numel(), 0);
  EXPECT_EQ(ln.backward(x, Pass{}).numel(), 0);
  for (const auto& e : params.entries()) {
    for (size_t k = 0; k < e.numel; ++k) EXPECT_EQ(params.grads().at(e.offset + k), 0.0f) << e.name << k;
  }
}

TEST(LayerNorm, RefusesBadArguments) {
  EXPECT_THROW(LayerNorm(0), InvalidArgument);
  EXPECT_THROW(LayerNorm(4, 0.0), InvalidArgument);
  EXPECT_THROW(LayerNorm(4, -1e-5), InvalidArgument);
  EXPECT_THROW(LayerNorm(4).outputShape(Shape{}), InvalidArgument);
  LayerNorm ln(5);
  EXPECT_EQ(ln.outputShape(Shape{2, 3, 5}), (Shape{2, 3, 5}));
  try {
    ln.outputShape(Shape{3, 4});
    FAIL() << "a last dimension of 4 for LayerNorm(5) was accepted";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("last dimension of 5"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
  }
  ParamBuffer params;
  bindParams(ln, params, 1);
  EXPECT_THROW(ln.forward(Tensor::zeros(Shape{2, 4}), Pass{}), InvalidArgument);
}

}  // namespace
}  // namespace cohort::nn
