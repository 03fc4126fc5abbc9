// How cuda::Convolution chooses its algorithms (runtime/cuda/dnn.h, runtime/gpu_options.h).
// chooseConvAlgorithm on made-up timings: the fastest that ran, in plain fp32 math and within the
// workspace limit; in exact mode never Winograd or FFT; nothing when nothing qualifies. Then
// Convolution::prepare on a device (the emulated one in CI; skips without one): it measures each
// shape and policy once and keeps the choice; exact mode picks only fp32-accumulating algorithms; a
// workspace limit of 0 leaves only algorithms that need none. On the emulated device, whose times are
// known (cudasim/cudnn_algorithms.h), fastest mode takes WINOGRAD_NONFUSED for cnn:rosetta's 3x3 layer
// in all three directions, and exact mode the fastest GEMM-family algorithms; the TF32 policy reaches
// the descriptors' math type.
#include "runtime/cuda/dnn.h"

#include <cudnn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "runtime/cuda/gpu_context.h"
#include "runtime/random.h"
#include "runtime/tensor.h"
#include "tests/runtime/cuda/gpu_test_util.h"

namespace cohort::runtime::cuda {
namespace {

constexpr ConvPolicy kFastest{.algorithms = ConvAlgorithms::kFastest};
constexpr ConvPolicy kExact{.algorithms = ConvAlgorithms::kExact};

TEST(ChooseConvAlgorithm, TakesTheFastestThatRanInPlainMathWithinTheWorkspaceLimit) {
  const std::vector<ConvAlgoTiming> timings = {
      {.algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, .ran = true, .plainMath = true, .ms = 3.0f, .workspaceBytes = 64},
      {.algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, .ran = false, .plainMath = true, .ms = -1.0f},  // failed
      {.algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, .ran = true, .plainMath = false, .ms = 0.5f},   // TF32
      {.algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED,
       .ran = true,
       .plainMath = true,
       .ms = 1.0f,
       .workspaceBytes = 1000},
      {.algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT,
       .ran = true,
       .plainMath = true,
       .ms = 0.25f,
       .workspaceBytes = size_t{1} << 30},  // over the default limit
  };
  const ConvAlgoTiming* fastest = chooseConvAlgorithm(timings, ConvDirection::kBackwardFilter, kFastest);
  ASSERT_NE(fastest, nullptr);
  EXPECT_EQ(fastest->algo, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED);
  const ConvAlgoTiming* exact = chooseConvAlgorithm(timings, ConvDirection::kBackwardFilter, kExact);
  ASSERT_NE(exact, nullptr);
  EXPECT_EQ(exact->algo, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
  // A limit below Winograd's need leaves ALGO_1; below that, nothing.
  const ConvAlgoTiming* small =
      chooseConvAlgorithm(timings, ConvDirection::kBackwardFilter, {.maxWorkspaceBytes = 999});
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(small->algo, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
  EXPECT_EQ(chooseConvAlgorithm(timings, ConvDirection::kBackwardFilter, {.maxWorkspaceBytes = 63}), nullptr);
  EXPECT_EQ(chooseConvAlgorithm({}, ConvDirection::kForward, kFastest), nullptr);
  // Equal times: the first listed (cuDNN lists the fastest first).
  const std::vector<ConvAlgoTiming> tie = {
      {.algo = CUDNN_CONVOLUTION_FWD_ALGO_GEMM, .ran = true, .plainMath = true, .ms = 1.0f},
      {.algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, .ran = true, .plainMath = true, .ms = 1.0f}};
  EXPECT_EQ(chooseConvAlgorithm(tie, ConvDirection::kForward, kExact)->algo, CUDNN_CONVOLUTION_FWD_ALGO_GEMM);
}

TEST(ChooseConvAlgorithm, ExactModeNeverTakesWinogradOrFft) {
  for (int a = 0; a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; ++a) {
    const bool transformed = a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
                             a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD ||
                             a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
    EXPECT_EQ(accumulatesInFp32(ConvDirection::kForward, a), !transformed) << "forward " << a;
  }
  for (int a = 0; a < CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT; ++a) {
    const bool transformed =
        a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
        a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
    EXPECT_EQ(accumulatesInFp32(ConvDirection::kBackwardData, a), !transformed) << "data " << a;
  }
  for (int a = 0; a < CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT; ++a) {
    const bool transformed =
        a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
        a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
    EXPECT_EQ(accumulatesInFp32(ConvDirection::kBackwardFilter, a), !transformed) << "filter " << a;
  }
  // Only Winograd and FFT measured: nothing for exact mode.
  const std::vector<ConvAlgoTiming> transformedOnly = {
      {.algo = CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, .ran = true, .plainMath = true, .ms = 1.0f},
      {.algo = CUDNN_CONVOLUTION_FWD_ALGO_FFT, .ran = true, .plainMath = true, .ms = 2.0f}};
  EXPECT_EQ(chooseConvAlgorithm(transformedOnly, ConvDirection::kForward, kExact), nullptr);
  EXPECT_NE(chooseConvAlgorithm(transformedOnly, ConvDirection::kForward, kFastest), nullptr);
}

// TF32 (tensor-core) timings only with policy.tf32 (--tf32); those that convert fp32 data to 16 bits never.
TEST(ChooseConvAlgorithm, TakesTf32AlgorithmsOnlyWhenAskedAndNeverConvertingOnes) {
  const std::vector<ConvAlgoTiming> timings = {
      {.algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, .ran = true, .plainMath = true, .ms = 3.0f},
      {.algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, .ran = true, .plainMath = false, .ms = 1.0f},
      {.algo = CUDNN_CONVOLUTION_FWD_ALGO_GEMM, .ran = true, .convertsInputs = true, .ms = 0.5f}};
  EXPECT_EQ(chooseConvAlgorithm(timings, ConvDirection::kForward, kFastest)->algo,
            CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);
  const ConvPolicy tf32{.tf32 = true};
  EXPECT_EQ(chooseConvAlgorithm(timings, ConvDirection::kForward, tf32)->algo,
            CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
}

// cnn:rosetta's second layer (tests/nn/gpu:gpu_layers_test's conv_rosetta_layer).
constexpr ConvShape kRosetta{
    .batch = 8, .channels = 50, .height = 16, .width = 16, .out = 100, .kernelH = 3, .kernelW = 3, .padding = 1};

// A layer's buffers for `shape` on `gpu`: what Conv2d passes to prepare().
struct LayerBuffers {
  LayerBuffers(const ConvShape& s, GpuContext& gpu)
      : x(Tensor::empty(Shape{s.batch, s.channels, s.height, s.width}, gpu.allocator())),
        w(Tensor::empty(Shape{s.out, s.channels, s.kernelH, s.kernelW}, gpu.allocator())),
        y(Tensor::empty(Shape{s.batch, s.out, s.outHeight(), s.outWidth()}, gpu.allocator())) {}
  ConvPrepareOptions options(const ConvShape& s, const ConvPolicy& policy) {
    return {.shape = s, .x = x.data(), .w = w.data(), .y = y.data(), .policy = policy};
  }
  Tensor x, w, y;
};

class ConvolutionTest : public ::testing::Test {
 protected:
  void SetUp() override { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_F(ConvolutionTest, MeasuresEachShapeAndPolicyOnceAndKeepsTheChoice) {
  GpuContext gpu(Device::cuda(0));
  Convolution conv;
  ConvShape last = kRosetta;
  last.batch = 5;  // an epoch's smaller last batch
  LayerBuffers full(kRosetta, gpu), small(last, gpu);
  conv.prepare(gpu.dnn(), full.options(kRosetta, kFastest), gpu.allocator());
  EXPECT_EQ(conv.measurements(), 1);
  const ConvAlgorithmChoice first = conv.chosen();
  conv.prepare(gpu.dnn(), full.options(kRosetta, kFastest), gpu.allocator());
  EXPECT_EQ(conv.measurements(), 1);
  conv.prepare(gpu.dnn(), small.options(last, kFastest), gpu.allocator());
  EXPECT_EQ(conv.measurements(), 2);
  for (int epoch = 0; epoch < 3; ++epoch) {
    conv.prepare(gpu.dnn(), full.options(kRosetta, kFastest), gpu.allocator());
    EXPECT_EQ(conv.chosen().forward, first.forward);
    EXPECT_EQ(conv.chosen().data, first.data);
    EXPECT_EQ(conv.chosen().filter, first.filter);
    EXPECT_EQ(conv.chosen().workspaceBytes, first.workspaceBytes);
    conv.prepare(gpu.dnn(), small.options(last, kFastest), gpu.allocator());
  }
  EXPECT_EQ(conv.measurements(), 2) << "the steady loop measures nothing";
  conv.prepare(gpu.dnn(), full.options(kRosetta, kExact), gpu.allocator());
  EXPECT_EQ(conv.measurements(), 3) << "another policy is another choice";
}

TEST_F(ConvolutionTest, ExactModeTakesOnlyAlgorithmsThatAccumulateInFp32) {
  GpuContext gpu(Device::cuda(0), {.conv = kExact});
  Convolution fastest, exact;
  LayerBuffers b(kRosetta, gpu);
  fastest.prepare(gpu.dnn(), b.options(kRosetta, kFastest), gpu.allocator());
  exact.prepare(gpu.dnn(), b.options(kRosetta, gpu.options().conv), gpu.allocator());
  const ConvAlgorithmChoice e = exact.chosen();
  EXPECT_TRUE(accumulatesInFp32(ConvDirection::kForward, e.forward)) << exact.describe();
  EXPECT_TRUE(accumulatesInFp32(ConvDirection::kBackwardData, e.data)) << exact.describe();
  EXPECT_TRUE(accumulatesInFp32(ConvDirection::kBackwardFilter, e.filter)) << exact.describe();
  EXPECT_LE(e.workspaceBytes, kExact.maxWorkspaceBytes);
#ifdef COHORT_CUDASIM
  // The emulation's times (cudasim/cudnn_algorithms.h): Winograd wins this layer, and among the GEMM
  // family the best-rated kernels.
  const ConvAlgorithmChoice f = fastest.chosen();
  EXPECT_EQ(f.forward, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED) << fastest.describe();
  EXPECT_EQ(f.data, CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED) << fastest.describe();
  EXPECT_EQ(f.filter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED) << fastest.describe();
  EXPECT_EQ(e.forward, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) << exact.describe();
  EXPECT_EQ(e.data, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1) << exact.describe();
  EXPECT_EQ(e.filter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1) << exact.describe();
#endif
}

TEST_F(ConvolutionTest, AlgorithmsThatFailOrNeedMoreWorkspaceThanTheLimitAreSkipped) {
  GpuContext gpu(Device::cuda(0));
  Convolution conv;
  LayerBuffers b(kRosetta, gpu);
  conv.prepare(gpu.dnn(), b.options(kRosetta, {.maxWorkspaceBytes = 0}), gpu.allocator());
  EXPECT_EQ(conv.chosen().workspaceBytes, 0u) << conv.describe();
#ifdef COHORT_CUDASIM
  // The emulation's one algorithm per direction that needs no workspace.
  EXPECT_EQ(conv.chosen().forward, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);
  EXPECT_EQ(conv.chosen().data, CUDNN_CONVOLUTION_BWD_DATA_ALGO_0);
  EXPECT_EQ(conv.chosen().filter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0);
  // Strided: Winograd and FFT cannot run it (not supported, time -1) and are not taken.
  const ConvShape strided{.batch = 3,
                          .channels = 50,
                          .height = 17,
                          .width = 16,
                          .out = 100,
                          .kernelH = 3,
                          .kernelW = 3,
                          .stride = 2,
                          .padding = 1};
  Convolution conv2;
  LayerBuffers b2(strided, gpu);
  conv2.prepare(gpu.dnn(), b2.options(strided, kFastest), gpu.allocator());
  EXPECT_TRUE(accumulatesInFp32(ConvDirection::kForward, conv2.chosen().forward)) << conv2.describe();
  EXPECT_TRUE(accumulatesInFp32(ConvDirection::kBackwardData, conv2.chosen().data)) << conv2.describe();
  EXPECT_TRUE(accumulatesInFp32(ConvDirection::kBackwardFilter, conv2.chosen().filter)) << conv2.describe();
#endif
}

// --tf32 reaches the convolution: its descriptors ask for CUDNN_DEFAULT_MATH, whose TF32 kernels
// round the inputs to 10 bits of mantissa. Against the same layer in plain FMA math, the output stays
// within TF32's tolerance (normwise 1e-2: 450 products of inputs each rounded by up to 2^-11); on the
// emulated device, which rounds operands to TF32 in default math, it must also differ (the math type
// did change). A GPU may still pick an FMA kernel when it is faster, so there only the bound holds.
TEST_F(ConvolutionTest, Tf32PolicyLetsConvolutionsRoundToTf32) {
  GpuContext gpu(Device::cuda(0));
  LayerBuffers b(kRosetta, gpu);
  Tensor xHost = Tensor::zeros(b.x.shape()), wHost = Tensor::zeros(b.w.shape());
  Rng rng(3);
  for (int64_t i = 0; i < xHost.numel(); ++i) xHost.at(i) = rng.uniform(-1.0f, 1.0f);
  for (int64_t i = 0; i < wHost.numel(); ++i) wHost.at(i) = rng.uniform(-0.1f, 0.1f);
  auto outputWith = [&](const ConvPolicy& policy) {
    Convolution conv;
    conv.prepare(gpu.dnn(), b.options(kRosetta, policy), gpu.allocator());
    b.x.copyFrom(xHost);  // after measuring, which writes the layer's buffers
    b.w.copyFrom(wHost);
    conv.forward(gpu.dnn(), b.x.data(), b.w.data(), nullptr, b.y.data());
    gpu.stream().synchronize();
    return b.y.clone();
  };
  const Tensor plain = outputWith({.algorithms = ConvAlgorithms::kExact});
  const Tensor tf32 = outputWith({.algorithms = ConvAlgorithms::kExact, .tf32 = true});
  double scale = 1, worst = 0;
  for (int64_t i = 0; i < plain.numel(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(plain.at(i))));
    worst = std::max(worst, std::abs(static_cast<double>(plain.at(i)) - tf32.at(i)));
  }
  std::printf("TF32 against plain fp32: normwise difference %.2e\n", worst / scale);
  EXPECT_LE(worst / scale, 1e-2);
#ifdef COHORT_CUDASIM
  EXPECT_GT(worst / scale, 1e-5) << "the TF32 policy computed in plain fp32";
#endif
}

}  // namespace
}  // namespace cohort::runtime::cuda
