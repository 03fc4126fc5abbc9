// The user's own test of their layer: its backward against finite differences, with Cohort's
// public gradient check (nn/grad_check.h), alone and inside a residual block.
#include <gtest/gtest.h>

#include "cohort/cohort.h"
#include "examples/custom_layer/learned_swish.h"

namespace example {
namespace {

using namespace cohort;

Tensor randomInput(const Shape& shape, uint64_t seed) {
  Tensor x = Tensor::zeros(shape);
  runtime::Rng rng(seed);
  for (int64_t i = 0; i < x.numel(); ++i) x.at(i) = rng.uniform(-2.0f, 2.0f);
  return x;
}

TEST(LearnedSwish, BackwardMatchesFiniteDifferences) {
  LearnedSwish layer(5);
  nn::ParamBuffer params;
  layer.registerParams(params, "swish.");
  params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(1);
  layer.resetParams(rng);
  params.values().at(2) = -0.7f;  // a β other than the initial 1
  nn::GradCheckResult r = nn::checkGradients(layer, params, randomInput(Shape{4, 5}, 2));
  EXPECT_TRUE(r.ok) << r.summary();
  EXPECT_GT(r.checked, 20);
}

TEST(LearnedSwish, InsideAResidualBlock) {
  auto inner = std::make_unique<nn::Sequential>();
  inner->add(std::make_unique<nn::Linear>(6, 6), "fc").add(std::make_unique<LearnedSwish>(6), "act");
  nn::Residual block(std::move(inner));
  nn::ParamBuffer params;
  block.registerParams(params, "res.");
  params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(3);
  block.resetParams(rng);
  nn::GradCheckResult r = nn::checkGradients(block, params, randomInput(Shape{3, 6}, 4));
  EXPECT_TRUE(r.ok) << r.summary();
}

TEST(LearnedSwish, RefusesAnInputOfAnotherWidth) {
  LearnedSwish layer(5);
  EXPECT_THROW(layer.outputShape(Shape{4, 6}), InvalidArgument);
}

}  // namespace
}  // namespace example
