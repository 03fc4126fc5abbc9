// The image layers (and Residual, CausalSelfAttention, TransformerBlock) on a GPU against the same layers on the CPU
// (tags = ["gpu"]; skips with the reason when no CUDA device is usable): Conv2d (cuDNN), MaxPool2d, AvgPool2d and
// BatchNorm2d with identical parameters and input must give the same output, input gradient, parameter gradients
// (overwritten, then accumulated) and running statistics. Convolutions run in exact mode there
// (runtime/gpu_options.h: no Winograd or FFT), within 1e-4; in the default, fastest mode within the
// measured bound kFastestConvTolerance (GpuFastestConvolutionsTest). The CPU layers are themselves
// checked against finite differences (tests/nn/conv2d_test, pool_test, batchnorm_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/batchnorm.h"
#include "nn/conv2d.h"
#include "nn/gpt.h"
#include "nn/linear.h"
#include "nn/pool.h"
#include "nn/residual.h"
#include "nn/sequential.h"
#include "nn/transformer_block.h"
#include "runtime/random.h"
#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/gpu_context.h"
#include "tests/nn/gpu/gpu_compare.h"
#endif

namespace cohort::testing {
namespace {

#ifdef COHORT_HAVE_CUDA
using nn::ModulePtr;
using runtime::Device;
using runtime::Shape;
using runtime::Tensor;

struct LayerCase {
  std::string name;
  std::function<ModulePtr()> make;
  Shape input;
  bool training = true;
  bool ties = false;     // small integer inputs, so pooling windows hold equal maxima
  double tolerance = 0;  // relative (absolute below 1); 0: bit for bit
};

std::ostream& operator<<(std::ostream& os, const LayerCase& c) { return os << c.name; }

class GpuLayersTest : public ::testing::TestWithParam<LayerCase> {
 protected:
  void SetUp() override { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

// The layer made twice, one on the CPU and one on a GPU run with `options`, with identical
// parameters and input: outputs, input gradients, parameter gradients (overwritten, accumulated, and
// without an input gradient) and running statistics within `tolerance`.
void expectTheCpusResults(const LayerCase& c, const runtime::GpuOptions& options, double tolerance) {
  runtime::cuda::GpuContext gpu(Device::cuda(0), options);
  runtime::Rng rng(11);
  TwinModules twins(c.make, gpu, rng);
  nn::Module &cpu = *twins.cpu, &dev = *twins.dev;
  const nn::ParamBuffer &cpuParams = twins.cpuParams, &devParams = twins.devParams;

  Tensor x = Tensor::zeros(c.input);
  for (int64_t i = 0; i < x.numel(); ++i) {
    x.at(i) = c.ties ? static_cast<float>(static_cast<int>(rng.uniform(0.0f, 4.0f))) : rng.uniform(-2.0f, 2.0f);
  }
  Tensor dx = x.clone(gpu.allocator());
  nn::Pass cpuPass, devPass;
  cpuPass.training = devPass.training = c.training;
  devPass.gpu = &gpu;

  const Tensor& yc = cpu.forward(x, cpuPass);
  const Tensor& yg = dev.forward(dx, devPass);
  ASSERT_TRUE(yg.device().isCuda());
  expectClose(yc, toHost(yg, gpu), tolerance, "output");
  if (cpuParams.numel() > 0)
    expectClose(cpuParams.values(), toHost(devParams.values(), gpu), tolerance,
                "parameters and running statistics after forward");

  Tensor dy = Tensor::zeros(yc.shape());
  for (int64_t i = 0; i < dy.numel(); ++i) dy.at(i) = rng.uniform(-1.0f, 1.0f);
  Tensor ddy = dy.clone(gpu.allocator());
  for (bool accumulate : {false, true}) {
    cpuPass.accumulateGrads = devPass.accumulateGrads = accumulate;
    const std::string when = accumulate ? " (accumulated)" : " (overwritten)";
    const Tensor& gc = cpu.backward(dy, cpuPass);
    const Tensor& gg = dev.backward(ddy, devPass);
    expectClose(gc, toHost(gg, gpu), tolerance, "input gradient" + when);
    if (cpuParams.numel() > 0)
      expectClose(cpuParams.grads(), toHost(devParams.grads(), gpu), tolerance, "parameter gradients" + when);
  }
  // Without an input gradient the parameter gradients still come.
  cpuPass.needInputGrad = devPass.needInputGrad = false;
  cpuPass.accumulateGrads = devPass.accumulateGrads = false;
  EXPECT_FALSE(dev.backward(ddy, devPass).defined());
  cpu.backward(dy, cpuPass);
  if (cpuParams.numel() > 0)
    expectClose(cpuParams.grads(), toHost(devParams.grads(), gpu), tolerance,
                "parameter gradients without input gradient");
}

// Convolutions in exact mode (runtime/gpu_options.h): no Winograd or FFT, so they add the same fp32
// products as the CPU's im2col + GEMM in another order.
TEST_P(GpuLayersTest, MatchesTheCpu) {
  expectTheCpusResults(GetParam(), {.conv = {.algorithms = runtime::ConvAlgorithms::kExact}}, GetParam().tolerance);
}

// Convolutions add hundreds of products in another order than im2col + GEMM: float32 rounding.
constexpr double kConvTolerance = 1e-4;
constexpr double kNormTolerance = 1e-5;

std::vector<LayerCase> cases() {
  using nn::Conv2dOptions;
  auto conv = [](Conv2dOptions o) { return [o] { return ModulePtr(new nn::Conv2d(o)); }; };
  return {
      {"conv3x3_pad1", conv({.in = 3, .out = 5, .kernel = 3, .padding = 1}), Shape{4, 3, 9, 8}, true, false,
       kConvTolerance},
      {"conv_stride2_3x2", conv({.in = 2, .out = 4, .kernel = 3, .kernelW = 2, .stride = 2}), Shape{3, 2, 11, 10}, true,
       false, kConvTolerance},
      {"conv_no_bias_pad2", conv({.in = 4, .out = 3, .kernel = 5, .padding = 2, .bias = false}), Shape{2, 4, 6, 7},
       true, false, kConvTolerance},
      {"conv_rosetta_layer", conv({.in = 50, .out = 100, .kernel = 3, .padding = 1}), Shape{8, 50, 16, 16}, true, false,
       kConvTolerance},
      {"maxpool2", [] { return ModulePtr(new nn::MaxPool2d(2)); }, Shape{3, 4, 9, 8}, true, false, 0},
      {"maxpool3_stride2_ties", [] { return ModulePtr(new nn::MaxPool2d(3, 2)); }, Shape{2, 3, 11, 9}, true, true, 0},
      {"avgpool2", [] { return ModulePtr(new nn::AvgPool2d(2)); }, Shape{3, 4, 9, 8}, true, false, 0},
      {"avgpool3_stride2", [] { return ModulePtr(new nn::AvgPool2d(3, 2)); }, Shape{2, 3, 11, 9}, true, false, 0},
      {"batchnorm_train", [] { return ModulePtr(new nn::BatchNorm2d(6)); }, Shape{5, 6, 7, 3}, true, false,
       kNormTolerance},
      {"batchnorm_eval", [] { return ModulePtr(new nn::BatchNorm2d(6)); }, Shape{5, 6, 7, 3}, false, false,
       kNormTolerance},
      {"batchnorm_train_large_plane", [] { return ModulePtr(new nn::BatchNorm2d(3)); }, Shape{16, 3, 32, 32}, true,
       false, kNormTolerance},
      {"residual_linear_tanh",
       [] {
         auto f = std::make_unique<nn::Sequential>();
         f->add(std::make_unique<nn::Linear>(12, 12), "fc").add(nn::tanhActivation(), "tanh");
         return ModulePtr(new nn::Residual(std::move(f)));
       },
       Shape{6, 12}, true, false, kNormTolerance},
      // The fused attention kernels (gpu_attention_test sweeps their shapes): T = 1, odd T, one and several heads.
      {"attention_t1", [] { return ModulePtr(new nn::CausalSelfAttention({.dim = 8, .heads = 2})); }, Shape{3, 1, 8},
       true, false, kNormTolerance},
      {"attention_t7_2heads", [] { return ModulePtr(new nn::CausalSelfAttention({.dim = 8, .heads = 2})); },
       Shape{2, 7, 8}, true, false, kNormTolerance},
      {"attention_t40_1head", [] { return ModulePtr(new nn::CausalSelfAttention({.dim = 12, .heads = 1})); },
       Shape{2, 40, 12}, true, false, kNormTolerance},
      {"transformer_block", [] { return ModulePtr(new nn::TransformerBlock({.dim = 8, .heads = 2})); }, Shape{2, 9, 8},
       true, false, kNormTolerance},
      // c_fc 5 -> 20: no cuBLASLt GELU epilogue for 20 columns (a multiple of 8), so the unfused steps.
      {"transformer_block_unfused_gelu", [] { return ModulePtr(new nn::TransformerBlock({.dim = 5, .heads = 1})); },
       Shape{2, 6, 5}, true, false, kNormTolerance},
      // The bias and GELU in the product's epilogue (48 columns), and without it (12).
      {"linear_gelu", [] { return ModulePtr(new nn::Linear({.in = 20, .out = 48, .gelu = true})); }, Shape{3, 7, 20},
       true, false, kNormTolerance},
      {"linear_gelu_unfused", [] { return ModulePtr(new nn::Linear({.in = 9, .out = 12, .gelu = true})); },
       Shape{11, 9}, true, false, kNormTolerance},
      {"linear_gelu_no_bias",
       [] { return ModulePtr(new nn::Linear({.in = 16, .out = 24, .bias = false, .gelu = true})); }, Shape{5, 16}, true,
       false, kNormTolerance},
      // Token ids 0..3 (the small-integer inputs of `ties`).
      {"gpt_2_layers",
       [] { return ModulePtr(new nn::Gpt({.vocab = 5, .layers = 2, .heads = 2, .dim = 8, .context = 7})); },
       Shape{3, 6}, true, true, kNormTolerance},
  };
}

INSTANTIATE_TEST_SUITE_P(Layers, GpuLayersTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<LayerCase>& info) { return info.param.name; });

// Convolutions in the default mode, which lets Winograd and FFT algorithms in where they measure
// fastest. Measured worst errors, conv_rosetta_layer's accumulated weight gradient both times: on the
// emulated device (WINOGRAD_NONFUSED in all three directions; cudasim/cudnn_algorithms.h) 4.6e-3
// (output 2.1e-4, input gradient 1.3e-4, weight gradient 2.3e-3 overwritten); on an H200, where
// cuDNN's heuristics chose WINOGRAD_NONFUSED for the weight gradient, 8.3e-4 (4.4e-4 overwritten).
// The other cases run GEMM-family algorithms there and stay within 4e-6.
constexpr double kFastestConvTolerance = 6e-3;

class GpuFastestConvolutionsTest : public GpuLayersTest {};

TEST_P(GpuFastestConvolutionsTest, StayWithinTheirTolerance) {
  expectTheCpusResults(GetParam(), {.conv = {.algorithms = runtime::ConvAlgorithms::kFastest}}, kFastestConvTolerance);
}

std::vector<LayerCase> convolutionCases() {
  std::vector<LayerCase> convs;
  for (const LayerCase& c : cases()) {
    if (c.name.rfind("conv", 0) == 0) convs.push_back(c);
  }
  return convs;
}

INSTANTIATE_TEST_SUITE_P(Layers, GpuFastestConvolutionsTest, ::testing::ValuesIn(convolutionCases()),
                         [](const ::testing::TestParamInfo<LayerCase>& info) { return info.param.name; });
#else
TEST(GpuLayers, NeedCuda) { GTEST_SKIP() << "no CUDA device: CUDA support not compiled in"; }
#endif

}  // namespace
}  // namespace cohort::testing
