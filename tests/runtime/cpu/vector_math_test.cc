#include "runtime/cpu/vector_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace cohort::runtime::cpu {
namespace {

// Relative error against double precision, worst over the samples.
template <class F, class G>
double worstRelativeError(const std::vector<float>& xs, F approx, G exact) {
  double worst = 0;
  for (float x : xs) {
    const double want = exact(static_cast<double>(x));
    const double err = std::fabs(static_cast<double>(approx(x)) - want) / std::max(std::fabs(want), 1e-30);
    worst = std::max(worst, err);
  }
  return worst;
}

std::vector<float> samples(float lo, float hi, int n) {
  std::vector<float> xs;
  for (int i = 0; i <= n; ++i) xs.push_back(lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n));
  return xs;
}

TEST(VectorMath, ExpIsWithinTwoTenthsOfAMillionthRelative) {
  EXPECT_LT(worstRelativeError(samples(-87.0f, 88.0f, 2000003), expVectorised, [](double x) { return std::exp(x); }), 2e-7);
  EXPECT_LT(worstRelativeError(samples(-1.0f, 1.0f, 200001), expVectorised, [](double x) { return std::exp(x); }), 2e-7);
  EXPECT_EQ(expVectorised(0.0f), 1.0f);
  // Clamped, never infinite or zero.
  EXPECT_TRUE(std::isfinite(expVectorised(1000.0f)));
  EXPECT_GT(expVectorised(-1000.0f), 0.0f);
}

TEST(VectorMath, TanhIsWithinTwoTenthsOfAMillionthRelative) {
  auto exact = [](double x) { return std::tanh(x); };
  EXPECT_LT(worstRelativeError(samples(-12.0f, 12.0f, 2400001), tanhVectorised, exact), 2e-7);
  EXPECT_LT(worstRelativeError(samples(-0.7f, 0.7f, 1400001), tanhVectorised, exact), 2e-7);
  EXPECT_LT(worstRelativeError(samples(-1e-3f, 1e-3f, 200001), tanhVectorised, exact), 2e-7);
  EXPECT_EQ(tanhVectorised(0.0f), 0.0f);
  EXPECT_EQ(tanhVectorised(50.0f), 1.0f);
  EXPECT_EQ(tanhVectorised(-1e6f), -1.0f);
  EXPECT_EQ(tanhVectorised(-0.3f), -tanhVectorised(0.3f));
}

}  // namespace
}  // namespace cohort::runtime::cpu
