// nn::sumOfSquares and nn::clipCoefficient: hand-computed values, non-finite elements, no overflow
// for finite ones, and PyTorch's clip rule (max / (norm + 1e-6), never above 1).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "nn/grad_norm.h"

namespace cohort::nn {
namespace {

TEST(GradNorm, SumOfSquaresByHand) {
  const std::vector<float> threeFour = {3.0f, 4.0f};
  EXPECT_EQ(sumOfSquares(threeFour), 25.0);
  EXPECT_EQ(sumOfSquares({}), 0.0);
  // Every length around the eight lanes, and the tail: 1² + 2² + ... + n² = n(n+1)(2n+1)/6.
  for (int n = 1; n <= 40; ++n) {
    std::vector<float> v;
    for (int i = 1; i <= n; ++i) v.push_back(static_cast<float>(i));
    EXPECT_EQ(sumOfSquares(v), n * (n + 1) * (2 * n + 1) / 6.0) << n;
  }
}

TEST(GradNorm, ANonFiniteElementMakesTheSumNonFiniteAndHugeFiniteOnesDoNot) {
  std::vector<float> v(100, 1.0f);
  v[37] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(sumOfSquares(v)));
  v[37] = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(sumOfSquares(v)));
  // Squares of the largest floats overflow float but not double: finite gradients are finite.
  v.assign(1000, std::numeric_limits<float>::max());
  EXPECT_TRUE(std::isfinite(sumOfSquares(v)));
}

TEST(GradNorm, ClipCoefficientIsPyTorchsRule) {
  // Norm 5 clipped to 1: the gradient [3, 4] becomes [0.6, 0.8] (within 1e-6 of it).
  const float c = clipCoefficient(5.0, 1.0f);
  EXPECT_EQ(c, 1.0f / (5.0f + 1e-6f));
  EXPECT_NEAR(3.0f * c, 0.6f, 1e-6);
  EXPECT_NEAR(4.0f * c, 0.8f, 1e-6);
  // Below the limit: unchanged, never scaled up. At it, PyTorch's 1e-6 still scales a little.
  EXPECT_EQ(clipCoefficient(0.5, 1.0f), 1.0f);
  EXPECT_EQ(clipCoefficient(0.0, 1.0f), 1.0f);
  EXPECT_EQ(clipCoefficient(1.0, 1.0f), 1.0f / (1.0f + 1e-6f));
  EXPECT_LT(clipCoefficient(1.0, 1.0f), 1.0f);
}

}  // namespace
}  // namespace cohort::nn
