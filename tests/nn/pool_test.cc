// MaxPool2d, AvgPool2d, Flatten and Unflatten: finite-difference gradients, values, ties and views.
#include "nn/pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "nn/reshape.h"
#include "runtime/error.h"
#include "tests/nn/grad_check.h"

namespace cohort::nn {
namespace {

using testing::checkModuleGradients;
using testing::randomTensor;

// Distinct values 0.05 apart in shuffled order, so that a finite-difference step of 0.01 never
// changes which element of a window is the largest.
Tensor distinctTensor(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::zeros(shape);
  std::vector<int64_t> order(static_cast<size_t>(t.numel()));
  std::iota(order.begin(), order.end(), 0);
  runtime::Rng rng(seed);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  for (int64_t i = 0; i < t.numel(); ++i) t.at(i) = 0.05f * static_cast<float>(order[static_cast<size_t>(i)]) - 1.0f;
  return t;
}

Tensor tensorOf(const Shape& shape, std::initializer_list<float> values) {
  Tensor t = Tensor::zeros(shape);
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel());
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

struct PoolCase {
  int64_t kernel, stride;
  Shape input;
};

// Non-overlapping, overlapping (kernel > stride), gaps (stride > kernel), odd and non-square sizes
// whose last row or column does not fit a window.
const PoolCase kPoolCases[] = {
    {2, 0, Shape{2, 3, 4, 4}}, {2, 0, Shape{1, 2, 5, 7}}, {3, 2, Shape{2, 1, 7, 6}},
    {2, 3, Shape{1, 2, 8, 7}}, {3, 1, Shape{1, 1, 4, 5}}, {1, 0, Shape{1, 2, 2, 3}},
};

TEST(MaxPool2d, GradientsMatchFiniteDifferences) {
  for (const PoolCase& c : kPoolCases) {
    MaxPool2d pool(c.kernel, c.stride);
    SCOPED_TRACE(pool.name() + " on " + c.input.str());
    ParamBuffer none;
    checkModuleGradients(pool, none, distinctTensor(c.input, 1));
  }
}

TEST(AvgPool2d, GradientsMatchFiniteDifferences) {
  for (const PoolCase& c : kPoolCases) {
    AvgPool2d pool(c.kernel, c.stride);
    SCOPED_TRACE(pool.name() + " on " + c.input.str());
    ParamBuffer none;
    checkModuleGradients(pool, none, randomTensor(c.input, 2));
  }
}

TEST(MaxPool2d, ValuesAndShapes) {
  MaxPool2d pool(2);
  Tensor x = tensorOf(Shape{1, 1, 3, 5}, {1, 5, 2, 0, 9,  //
                                          3, 4, 8, 1, 9,  //
                                          7, 7, 7, 7, 7});
  const Tensor& y = pool.forward(x, Pass{});
  ASSERT_EQ(y.shape(), (Shape{1, 1, 1, 2}));  // the odd last row and column are dropped
  EXPECT_EQ(y.at(0), 5);
  EXPECT_EQ(y.at(1), 8);
  EXPECT_EQ(MaxPool2d(3, 2).outputShape(Shape{4, 2, 7, 8}), (Shape{4, 2, 3, 3}));
  EXPECT_THROW(pool.outputShape(Shape{1, 1, 1, 4}), InvalidArgument);
  EXPECT_THROW(pool.outputShape(Shape{1, 16}), InvalidArgument);
  EXPECT_THROW(MaxPool2d(0), InvalidArgument);
}

TEST(MaxPool2d, TheFirstMaximumWinsATieAndTakesTheWholeGradient) {
  MaxPool2d pool(2);
  Tensor x = tensorOf(Shape{1, 2, 2, 2}, {3, 3, 3, 3,    // all tied: the top-left one wins
                                          1, 2, 2, 0});  // tie in row-major order: (0, 1) wins
  pool.forward(x, Pass{});
  const Tensor& dx = pool.backward(tensorOf(Shape{1, 2, 1, 1}, {1.5f, -2}), Pass{});
  const float want[] = {1.5f, 0, 0, 0, 0, -2, 0, 0};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(dx.at(i), want[i]) << i;
}

TEST(MaxPool2d, OverlappingWindowsAddTheirGradients) {
  MaxPool2d pool(2, 1);
  Tensor x = tensorOf(Shape{1, 1, 3, 3}, {0, 0, 0,  //
                                          0, 9, 0,  //
                                          0, 0, 0});
  pool.forward(x, Pass{});
  const Tensor& dx = pool.backward(tensorOf(Shape{1, 1, 2, 2}, {1, 2, 3, 4}), Pass{});
  EXPECT_EQ(dx.at(4), 10.0f);  // the centre wins all four windows
  for (int i : {0, 1, 2, 3, 5, 6, 7, 8}) EXPECT_EQ(dx.at(i), 0.0f) << i;
  Pass noGrad;
  noGrad.needInputGrad = false;
  EXPECT_FALSE(pool.backward(tensorOf(Shape{1, 1, 2, 2}, {1, 2, 3, 4}), noGrad).defined());
}

TEST(AvgPool2d, Values) {
  AvgPool2d pool(2);
  Tensor x = tensorOf(Shape{1, 1, 2, 4}, {1, 2, 3, 4,  //
                                          5, 6, 7, 8});
  const Tensor& y = pool.forward(x, Pass{});
  ASSERT_EQ(y.shape(), (Shape{1, 1, 1, 2}));
  EXPECT_EQ(y.at(0), 3.5f);
  EXPECT_EQ(y.at(1), 5.5f);
  const Tensor& dx = pool.backward(tensorOf(Shape{1, 1, 1, 2}, {4, 8}), Pass{});
  for (int i : {0, 1, 4, 5}) EXPECT_EQ(dx.at(i), 1.0f);
  for (int i : {2, 3, 6, 7}) EXPECT_EQ(dx.at(i), 2.0f);
}

TEST(Flatten, IsAViewBothWays) {
  Flatten flatten;
  Tensor x = randomTensor(Shape{3, 2, 4, 5}, 3);
  const Tensor& y = flatten.forward(x, Pass{});
  EXPECT_EQ(y.shape(), (Shape{3, 40}));
  EXPECT_EQ(y.data(), x.data());
  Tensor dy = randomTensor(Shape{3, 40}, 4);
  const Tensor& dx = flatten.backward(dy, Pass{});
  EXPECT_EQ(dx.shape(), x.shape());
  EXPECT_EQ(dx.data(), dy.data());
  EXPECT_EQ(flatten.outputShape(Shape{0, 7, 2}), (Shape{0, 14}));
}

TEST(Unflatten, ViewsRowsAsImages) {
  Unflatten view(Shape{1, 28, 28});
  Tensor x = randomTensor(Shape{2, 784}, 5);
  const Tensor& y = view.forward(x, Pass{});
  EXPECT_EQ(y.shape(), (Shape{2, 1, 28, 28}));
  EXPECT_EQ(y.data(), x.data());
  EXPECT_EQ(view.outputShape(Shape{3, 1, 28, 28}), (Shape{3, 1, 28, 28}));  // already images
  EXPECT_EQ(view.outputShape(Shape{0, 784}), (Shape{0, 1, 28, 28}));
  const Tensor& dx = view.backward(randomTensor(Shape{2, 1, 28, 28}, 6), Pass{});
  EXPECT_EQ(dx.shape(), x.shape());
  EXPECT_THROW(view.outputShape(Shape{2, 785}), InvalidArgument);
  EXPECT_THROW(view.outputShape(Shape{784}), InvalidArgument);
  EXPECT_THROW(Unflatten(Shape{}), InvalidArgument);
  EXPECT_THROW(Unflatten(Shape{3, 0, 2}), InvalidArgument);
}

}  // namespace
}  // namespace cohort::nn
