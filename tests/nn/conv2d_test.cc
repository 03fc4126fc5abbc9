// Conv2d: finite-difference gradients over the geometry edge cases, forward values against a direct
// convolution, tiling, gradient accumulation, parallel tiles with several BLAS threads (same results
// as one thread, deterministic, allocation-free in steady state) and argument checks.
#include "nn/conv2d.h"

#include <gtest/gtest.h>

#include <cmath>

#include "runtime/cpu/blas.h"
#include "runtime/error.h"
#include "tests/nn/grad_check.h"
#include "tests/support/alloc_counter.h"


namespace cohort::nn {
namespace {

using testing::bindParams;
using testing::checkModuleGradients;
using testing::randomTensor;

// y[n, o, i, j] by the definition, in double.
std::vector<double> directConvolution(const Conv2d& conv, const Tensor& x) {
  const Conv2dOptions& o = conv.options();
  const int64_t kh = conv.weight().dim(2), kw = conv.weight().dim(3);
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3);
  const Shape outShape = conv.outputShape(x.shape());
  const int64_t oh = outShape[2], ow = outShape[3];
  std::vector<double> y;
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t oc = 0; oc < o.out; ++oc) {
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          double sum = o.bias ? conv.bias().at(oc) : 0.0;
          for (int64_t ic = 0; ic < c; ++ic) {
            for (int64_t u = 0; u < kh; ++u) {
              for (int64_t v = 0; v < kw; ++v) {
                int64_t ih = i * o.stride - o.padding + u, iw = j * o.stride - o.padding + v;
                if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                sum += static_cast<double>(conv.weight().at(((oc * c + ic) * kh + u) * kw + v)) *
                       x.at(((s * c + ic) * h + ih) * w + iw);
              }
            }
          }
          y.push_back(sum);
        }
      }
    }
  }
  return y;
}

struct Case {
  Conv2dOptions options;
  Shape input;
};

std::string describe(const Case& c) {
  return Conv2d(c.options).name() + " on " + c.input.str() +
         (c.options.tileColumns ? " tiles of " + std::to_string(c.options.tileColumns) : "");
}

// Stride 1 and 2, padding 0/1/2, non-square inputs and kernels, kernels larger than the stride,
// padding up to the kernel size (windows entirely in the padding), odd sizes, windows that do not fit at the edge, and
// tiles of several samples (with a remainder), of all samples, and of bands of rows (with a
// remainder, and with padding rows inside the first and last band).
const Case kCases[] = {
    {{.in = 2, .out = 3, .kernel = 3}, Shape{2, 2, 5, 5}},
    {{.in = 2, .out = 3, .kernel = 3, .padding = 1}, Shape{2, 2, 5, 4}},
    {{.in = 1, .out = 2, .kernel = 3, .stride = 2}, Shape{2, 1, 7, 6}},
    {{.in = 2, .out = 2, .kernel = 3, .stride = 2, .padding = 1}, Shape{1, 2, 6, 5}},
    {{.in = 2, .out = 2, .kernel = 3, .stride = 2, .padding = 2}, Shape{1, 2, 5, 5}},
    {{.in = 3, .out = 2, .kernel = 2, .kernelW = 3, .stride = 1, .padding = 1, .bias = false}, Shape{2, 3, 4, 3}},
    {{.in = 1, .out = 2, .kernel = 5, .padding = 2}, Shape{1, 1, 3, 4}},
    {{.in = 2, .out = 3, .kernel = 1}, Shape{2, 2, 3, 3}},
    {{.in = 1, .out = 2, .kernel = 3, .stride = 3}, Shape{1, 1, 8, 7}},
    {{.in = 1, .out = 2, .kernel = 2, .padding = 2}, Shape{1, 1, 3, 3}},  // corner windows all padding
    {{.in = 2, .out = 2, .kernel = 3, .padding = 1, .tileColumns = 40}, Shape{3, 2, 4, 5}},
    {{.in = 2, .out = 2, .kernel = 2, .stride = 2, .tileColumns = 100}, Shape{3, 2, 5, 5}},
    {{.in = 2, .out = 3, .kernel = 3, .padding = 1, .tileColumns = 10}, Shape{2, 2, 5, 4}},
    {{.in = 1, .out = 2, .kernel = 3, .stride = 2, .padding = 1, .tileColumns = 3}, Shape{2, 1, 7, 6}},
    {{.in = 2, .out = 2, .kernel = 3, .padding = 2, .bias = false, .tileColumns = 12}, Shape{1, 2, 4, 4}},
    // Rows wide enough for whole 8-float vectors and a partial one in the stride-1 kernels.
    {{.in = 1, .out = 2, .kernel = 3, .padding = 1}, Shape{1, 1, 4, 21}},
    {{.in = 2, .out = 1, .kernel = 3, .tileColumns = 40}, Shape{1, 2, 6, 19}},
};

TEST(Conv2d, ForwardMatchesADirectConvolution) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    Conv2d conv(c.options);
    ParamBuffer params;
    bindParams(conv, params, 1);
    Tensor x = randomTensor(c.input, 2);
    const Tensor& y = conv.forward(x, Pass{});
    ASSERT_EQ(y.shape(), conv.outputShape(c.input));
    std::vector<double> want = directConvolution(conv, x);
    ASSERT_EQ(static_cast<int64_t>(want.size()), y.numel());
    for (int64_t i = 0; i < y.numel(); ++i) EXPECT_NEAR(y.at(i), want[static_cast<size_t>(i)], 1e-5) << i;
  }
}

TEST(Conv2d, GradientsMatchFiniteDifferences) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    Conv2d conv(c.options);
    ParamBuffer params;
    bindParams(conv, params, 3);
    checkModuleGradients(conv, params, randomTensor(c.input, 4));
  }
}

TEST(Conv2d, OutputSizesFollowPyTorch) {
  Conv2d conv({.in = 3, .out = 4, .kernel = 3, .stride = 2, .padding = 1});
  EXPECT_EQ(conv.outputShape(Shape{5, 3, 32, 31}), (Shape{5, 4, 16, 16}));
  Conv2d rect({.in = 1, .out = 1, .kernel = 2, .kernelW = 4});
  EXPECT_EQ(rect.outputShape(Shape{1, 1, 5, 5}), (Shape{1, 1, 4, 2}));
  EXPECT_THROW(conv.outputShape(Shape{5, 2, 32, 32}), InvalidArgument);    // channels
  EXPECT_THROW(conv.outputShape(Shape{5, 3 * 32 * 32}), InvalidArgument);  // not NCHW
  EXPECT_THROW(rect.outputShape(Shape{1, 1, 5, 3}), InvalidArgument);      // narrower than the kernel
  EXPECT_THROW(Conv2d({.in = 1, .out = 1, .kernel = 0}), InvalidArgument);
  EXPECT_THROW(Conv2d({.in = 1, .out = 1, .kernel = 3, .stride = 0}), InvalidArgument);
  EXPECT_THROW(Conv2d({.in = 1, .out = 1, .kernel = 3, .padding = -1}), InvalidArgument);
}

TEST(Conv2d, TilingDoesNotChangeTheResult) {
  Tensor x = randomTensor(Shape{5, 3, 6, 7}, 5);
  Tensor dy = randomTensor(Shape{5, 4, 6, 7}, 6);
  std::vector<Tensor> results;
  // One row, two rows, one sample (42 positions), two samples, automatic.
  for (int64_t columns : {1, 14, 42, 84, 0}) {
    Conv2d conv({.in = 3, .out = 4, .kernel = 3, .padding = 1, .tileColumns = columns});
    ParamBuffer params;
    bindParams(conv, params, 7);
    Tensor y = conv.forward(x, Pass{}).clone();
    Tensor dx = conv.backward(dy, Pass{}).clone();
    if (results.empty()) {
      results = {y, dx, params.grads().clone()};
      continue;
    }
    for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(y.at(i), results[0].at(i), 1e-5) << columns;
    for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_NEAR(dx.at(i), results[1].at(i), 1e-5) << columns;
    for (int64_t i = 0; i < params.grads().numel(); ++i) {
      ASSERT_NEAR(params.grads().at(i), results[2].at(i), 1e-4) << columns;
    }
  }
}

TEST(Conv2d, AccumulatesGradientsAndSkipsTheInputGradientWhenAsked) {
  Conv2d conv({.in = 2, .out = 3, .kernel = 3, .padding = 1, .tileColumns = 8});
  ParamBuffer params;
  bindParams(conv, params, 8);
  Tensor x = randomTensor(Shape{3, 2, 4, 4}, 9);
  Tensor dy = randomTensor(Shape{3, 3, 4, 4}, 10);
  conv.forward(x, Pass{});
  conv.backward(dy, Pass{});
  Tensor once = params.grads().clone();
  Pass accumulate;
  accumulate.accumulateGrads = true;
  accumulate.needInputGrad = false;
  conv.forward(x, accumulate);
  EXPECT_FALSE(conv.backward(dy, accumulate).defined());
  for (int64_t i = 0; i < once.numel(); ++i) EXPECT_NEAR(params.grads().at(i), 2 * once.at(i), 1e-4) << i;
  // Without accumulateGrads the gradients are overwritten, not added to.
  conv.forward(x, Pass{});
  conv.backward(dy, Pass{});
  for (int64_t i = 0; i < once.numel(); ++i) EXPECT_NEAR(params.grads().at(i), once.at(i), 1e-5) << i;
}

TEST(Conv2d, HandlesAnEmptyBatch) {
  Conv2d conv({.in = 1, .out = 2, .kernel = 3});
  ParamBuffer params;
  bindParams(conv, params, 11);
  params.grads().fill(1.0f);
  Tensor x = Tensor::zeros(Shape{0, 1, 4, 4});
  EXPECT_EQ(conv.forward(x, Pass{}).shape(), (Shape{0, 2, 2, 2}));
  EXPECT_EQ(conv.backward(Tensor::zeros(Shape{0, 2, 2, 2}), Pass{}).shape(), x.shape());
  for (int64_t i = 0; i < conv.weightGrad().numel(); ++i) EXPECT_EQ(conv.weightGrad().at(i), 0.0f);
  for (int64_t i = 0; i < conv.biasGrad().numel(); ++i) EXPECT_EQ(conv.biasGrad().at(i), 0.0f);
}

TEST(Conv2d, DefaultInitIsPyTorchsUniformBound) {
  Conv2d conv({.in = 4, .out = 50, .kernel = 5});
  ParamBuffer params;
  bindParams(conv, params, 12);
  EXPECT_EQ(params.entries()[0].name, "weight");
  EXPECT_EQ(params.entries()[0].shape, (Shape{50, 4, 5, 5}));
  const float bound = 0.1f;  // 1 / sqrt(4 · 5 · 5)
  float maxAbs = 0, maxBias = 0;
  for (int64_t i = 0; i < conv.weight().numel(); ++i) maxAbs = std::max(maxAbs, std::fabs(conv.weight().at(i)));
  for (int64_t i = 0; i < conv.bias().numel(); ++i) maxBias = std::max(maxBias, std::fabs(conv.bias().at(i)));
  EXPECT_LE(maxAbs, bound);
  EXPECT_GT(maxAbs, 0.95f * bound);
  EXPECT_LE(maxBias, bound);
  EXPECT_GT(maxBias, 0.5f * bound);
}

struct Results {
  Tensor y, dx, grads;
};

// Forward, then backward twice with accumulateGrads (so the parallel path's accumulation is covered),
// with `threads` BLAS threads.
Results runWithThreads(const Conv2dOptions& options, const Tensor& x, const Tensor& dy, int threads) {
  runtime::cpu::BlasThreadsScope scope(threads);
  Conv2d conv(options);
  ParamBuffer params;
  bindParams(conv, params, 13);
  Results r;
  r.y = conv.forward(x, Pass{}).clone();
  r.dx = conv.backward(dy, Pass{}).clone();
  Pass accumulate;
  accumulate.accumulateGrads = true;
  conv.forward(x, accumulate);
  conv.backward(dy, accumulate);
  r.grads = params.grads().clone();
  EXPECT_EQ(runtime::cpu::blasThreads(), threads) << "the BLAS thread count is restored";
  return r;
}

// Whole-sample tiles (several per tile, and a batch smaller than the threads), row bands of one
// sample with padding (overlapping input rows), strides, no bias, and the automatic tiling.
const Case kParallelCases[] = {
    {{.in = 3, .out = 4, .kernel = 3, .padding = 1}, Shape{5, 3, 6, 7}},
    {{.in = 3, .out = 4, .kernel = 3, .padding = 1, .tileColumns = 14}, Shape{5, 3, 6, 7}},
    {{.in = 2, .out = 3, .kernel = 3, .padding = 2, .bias = false, .tileColumns = 5}, Shape{3, 2, 5, 5}},
    {{.in = 2, .out = 2, .kernel = 2, .stride = 2, .tileColumns = 100}, Shape{7, 2, 5, 5}},
    {{.in = 2, .out = 3, .kernel = 3, .stride = 2, .padding = 1, .tileColumns = 3}, Shape{2, 2, 7, 6}},
    {{.in = 3, .out = 5, .kernel = 3, .padding = 1}, Shape{1, 3, 9, 9}},
    {{.in = 3, .out = 50, .kernel = 3, .padding = 1}, Shape{9, 3, 32, 32}},
};

TEST(Conv2d, ParallelTilesMatchOneThreadAndAreDeterministic) {
  for (const Case& c : kParallelCases) {
    SCOPED_TRACE(describe(c));
    Tensor x = randomTensor(c.input, 14);
    Tensor dy = randomTensor(Conv2d(c.options).outputShape(c.input), 15);
    Results one = runWithThreads(c.options, x, dy, 1);
    for (int threads : {2, 3}) {
      SCOPED_TRACE(std::to_string(threads) + " threads");
      Results a = runWithThreads(c.options, x, dy, threads), b = runWithThreads(c.options, x, dy, threads);
      for (int64_t i = 0; i < one.y.numel(); ++i) ASSERT_NEAR(a.y.at(i), one.y.at(i), 1e-5) << i;
      for (int64_t i = 0; i < one.dx.numel(); ++i) ASSERT_NEAR(a.dx.at(i), one.dx.at(i), 1e-5) << i;
      for (int64_t i = 0; i < one.grads.numel(); ++i) {
        ASSERT_NEAR(a.grads.at(i), one.grads.at(i), 1e-4 * (1 + std::fabs(one.grads.at(i)))) << i;
      }
      for (int64_t i = 0; i < a.y.numel(); ++i) ASSERT_EQ(a.y.at(i), b.y.at(i)) << i;
      for (int64_t i = 0; i < a.dx.numel(); ++i) ASSERT_EQ(a.dx.at(i), b.dx.at(i)) << i;
      for (int64_t i = 0; i < a.grads.numel(); ++i) ASSERT_EQ(a.grads.at(i), b.grads.at(i)) << i;
    }
  }
}

TEST(Conv2d, ParallelTilesAllocateNothingInSteadyState) {
  runtime::cpu::BlasThreadsScope scope(2);
  Conv2d conv({.in = 3, .out = 8, .kernel = 3, .padding = 1, .tileColumns = 20});
  ParamBuffer params;
  bindParams(conv, params, 16);
  Tensor big = randomTensor(Shape{6, 3, 8, 8}, 17), small = randomTensor(Shape{3, 3, 8, 8}, 18);
  Tensor dyBig = randomTensor(Shape{6, 8, 8, 8}, 19), dySmall = randomTensor(Shape{3, 8, 8, 8}, 20);
  conv.forward(big, Pass{});
  conv.backward(dyBig, Pass{});  // sizes every buffer and starts the pool
  long before = cohort::testing::allocationCount();
  for (int i = 0; i < 4; ++i) {
    conv.forward(i % 2 ? small : big, Pass{});
    conv.backward(i % 2 ? dySmall : dyBig, Pass{});
  }
  EXPECT_EQ(cohort::testing::allocationCount() - before, 0);
}

}  // namespace
}  // namespace cohort::nn
