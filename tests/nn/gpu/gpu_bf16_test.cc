// Layers in a bf16 pass on a GPU against the same layers in fp32 on the CPU (tags = ["gpu"]; skips
// with the reason when no CUDA device is usable), with identical parameters and input: the output,
// the input gradient and the parameter gradients (overwritten and accumulated) must lie within
// bf16's tolerance of the CPU's fp32 results, stated per layer below (docs/gpu.md, "Precision").
// Layers that do not take bf16 (Activation here, standing for a user's fp32 layer) run in fp32
// inside a bf16 Sequential: the Sequential converts at their boundaries (nn/precision.h). The
// LayerNorm, GELU, the attention, the transformer block and the GPT keep their activations in bf16
// (the residual stream and every sum inside the kernels stay fp32).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/gelu.h"
#include "nn/gpt.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/model.h"
#include "nn/sequential.h"
#include "nn/transformer_block.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/random.h"
#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/gpu_context.h"
#include "tests/nn/gpu/gpu_compare.h"
#endif

namespace cohort::testing {
namespace {

using nn::ModulePtr;
using runtime::DType;
using runtime::Shape;
using runtime::Tensor;

// A CPU Linear refuses a bf16 pass rather than computing it in fp32 unasked.
TEST(Bf16Layers, TheCpuRefusesABf16Pass) {
  nn::Linear fc(4, 3);
  nn::ParamBuffer params;
  fc.registerParams(params, "");
  params.allocate(runtime::cpuAllocator());
  nn::Pass pass;
  pass.precision = DType::kBF16;
  try {
    fc.forward(Tensor::zeros(Shape{2, 4}), pass);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("fp32 only"), std::string::npos) << e.what();
  }
}

#ifdef COHORT_HAVE_CUDA
using runtime::Device;

struct Bf16Case {
  std::string name;
  std::function<ModulePtr()> make;
  Shape input;
  double tolerance;  // normwise (expectNormwiseClose)
  bool ids = false;  // token ids 0..3 (a GPT's input) instead of values in [-2, 2)
  bool fp32Output = false;  // a module whose output stays fp32 (the residual stream)
};

std::ostream& operator<<(std::ostream& os, const Bf16Case& c) { return os << c.name; }

// `t` on the host in fp32, once `gpu` has run what it was given (bf16 widened exactly).
Tensor floatOnHost(const Tensor& t, runtime::cuda::GpuContext& gpu) {
  Tensor host = toHost(t, gpu);
  if (host.dtype() == DType::kF32) return host;
  Tensor wide = Tensor::zeros(host.shape());
  const uint16_t* bits = host.data<uint16_t>();
  for (int64_t i = 0; i < host.numel(); ++i) wide.at(i) = runtime::toFloat(runtime::Bf16{bits[i]});
  return wide;
}

// Normwise: the largest difference from the CPU's fp32 result, over the larger of 1 and the CPU
// result's largest magnitude, at most `bound` (low-precision sums err in proportion to the size of
// their terms, not of the result, so an elementwise relative bound would fail on any cancellation).
// The measured figure is printed, so the bounds can be checked against it. Returns it.
double expectNormwiseClose(const Tensor& cpu, const Tensor& gpuOnHost, double bound, const std::string& what) {
  EXPECT_EQ(cpu.numel(), gpuOnHost.numel()) << what;
  if (cpu.numel() != gpuOnHost.numel()) return INFINITY;
  double worst = 0, scale = 1;
  int64_t at = 0;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(cpu.at(i))));
    const double err = std::abs(static_cast<double>(cpu.at(i)) - gpuOnHost.at(i));
    if (!(err <= worst)) worst = err, at = i;  // a NaN is the worst
  }
  std::printf("%s: normwise error %.4f of bound %.4f\n", what.c_str(), worst / scale, bound);
  EXPECT_LE(worst / scale, bound) << what << ": worst at element " << at << ": cpu " << cpu.at(at) << " gpu "
                                  << gpuOnHost.at(at) << ", scale " << scale;
  return worst / scale;
}

class Bf16LayersTest : public ::testing::TestWithParam<Bf16Case> {
 protected:
  void SetUp() override { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_P(Bf16LayersTest, StaysWithinBf16OfTheCpusFp32) {
  const Bf16Case& c = GetParam();
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  runtime::Rng rng(5);
  TwinModules twins(c.make, gpu, rng);
  nn::Module &cpu = *twins.cpu, &dev = *twins.dev;
  const nn::ParamBuffer &cpuParams = twins.cpuParams, &devParams = twins.devParams;

  Tensor x = Tensor::zeros(c.input);
  for (int64_t i = 0; i < x.numel(); ++i) {
    x.at(i) = c.ids ? static_cast<float>(static_cast<int>(rng.uniform(0.0f, 4.0f))) : rng.uniform(-2.0f, 2.0f);
  }
  Tensor dx = x.clone(gpu.allocator());
  nn::Pass cpuPass, devPass;
  devPass.gpu = &gpu;
  devPass.precision = DType::kBF16;

  const Tensor& yc = cpu.forward(x, cpuPass);
  const Tensor& yg = dev.forward(dx, devPass);
  EXPECT_EQ(yg.dtype(), c.fp32Output ? DType::kF32 : DType::kBF16);
  // Above fp32's rounding by far: the products did run in bf16 (a pass left in fp32 errs by ~1e-6).
  EXPECT_GT(expectNormwiseClose(yc, floatOnHost(yg, gpu), c.tolerance, "output"), std::ldexp(1.0, -12));

  Tensor dy = Tensor::zeros(yc.shape());
  for (int64_t i = 0; i < dy.numel(); ++i) dy.at(i) = rng.uniform(-1.0f, 1.0f);
  Tensor ddy = dy.clone(gpu.allocator());  // an fp32 gradient, as the loss hands it
  for (bool accumulate : {false, true}) {
    cpuPass.accumulateGrads = devPass.accumulateGrads = accumulate;
    const std::string when = accumulate ? " (accumulated)" : " (overwritten)";
    const Tensor& gc = cpu.backward(dy, cpuPass);
    const Tensor& gg = dev.backward(ddy, devPass);
    if (!c.ids) expectNormwiseClose(gc, floatOnHost(gg, gpu), c.tolerance, "input gradient" + when);
    const Tensor grads = floatOnHost(devParams.grads(), gpu);
    EXPECT_EQ(devParams.grads().dtype(), DType::kF32);
    expectNormwiseClose(cpuParams.grads(), grads, c.tolerance, "parameter gradients" + when);
  }
}

// Inputs in [-2, 2), parameters moved by up to ±0.2, gradients in [-1, 1). Each input and weight is
// rounded to bf16 (relative error up to 2^-9), the products are exact and summed in fp32, and a bf16
// result is rounded once more: errors of a few 2^-9 of the terms' size. Measured on the emulated
// device (normwise): a Linear at most 0.0040 (output, input and parameter gradients; with GELU), a LayerNorm's
// bf16 output 0.0022, so the bound is 1e-2 (2.6 · 2^-8). A layer reading bf16 bits as floats, or
// dropping or repeating a term, errs by order 1; one left in fp32 fails the lower bound in the test.
constexpr double kLinearTolerance = 1e-2;
// Composites chain several bf16 products and bf16 activations (attention: two projections around
// the bf16 core; a block: four, with LayerNorm and GELU between them; a GPT: two blocks and the
// head; the attention's forward on tensor cores rounds P to bf16): measured at most 0.0103 (a GPT's
// gradients); bound 2e-2.
constexpr double kCompositeTolerance = 2e-2;

std::vector<Bf16Case> cases() {
  auto linear = [](int64_t in, int64_t out, bool bias) {
    return [=] { return ModulePtr(new nn::Linear({.in = in, .out = out, .bias = bias})); };
  };
  return {
      {"linear", linear(64, 48, true), Shape{37, 64}, kLinearTolerance},
      {"linear_no_bias_3d", linear(24, 40, false), Shape{3, 5, 24}, kLinearTolerance},
      {"linear_one_row", linear(7, 5, true), Shape{1, 7}, kLinearTolerance},
      // The bias and GELU in the product's epilogue (48 columns), and without it (12 columns).
      {"linear_gelu", [] { return ModulePtr(new nn::Linear({.in = 32, .out = 48, .gelu = true})); }, Shape{2, 9, 32},
       kLinearTolerance},
      {"linear_gelu_unfused", [] { return ModulePtr(new nn::Linear({.in = 9, .out = 12, .gelu = true})); },
       Shape{11, 9}, kLinearTolerance},
      // bf16 Linear, fp32 Tanh (converted in and out by the Sequential), bf16 Linear.
      {"sequential_with_an_fp32_layer",
       [] {
         auto s = std::make_unique<nn::Sequential>();
         s->add(std::make_unique<nn::Linear>(32, 24), "fc0")
             .add(nn::tanhActivation(), "tanh")
             .add(std::make_unique<nn::Linear>(24, 10), "fc1");
         return ModulePtr(std::move(s));
       },
       Shape{16, 32}, kLinearTolerance},
      // bf16 from end to end: LayerNorm and GELU read and write bf16 between the bf16 Linears, and
      // their backward reads bf16 gradients.
      {"linear_layer_norm_gelu_linear",
       [] {
         auto s = std::make_unique<nn::Sequential>();
         s->add(std::make_unique<nn::Linear>(32, 48), "fc0")
             .add(std::make_unique<nn::LayerNorm>(48), "ln")
             .add(nn::gelu(), "gelu")
             .add(std::make_unique<nn::Linear>(48, 16), "fc1");
         return ModulePtr(std::move(s));
       },
       Shape{2, 9, 32}, kCompositeTolerance},
      // An fp32 input: the output rounded to bf16 for the projection after it, the input gradient fp32.
      {"layer_norm", [] { return ModulePtr(new nn::LayerNorm(40)); }, Shape{11, 40}, kLinearTolerance},
      // The projections and the fused core between them in bf16 (T = 1, odd T, several heads).
      {"attention_t7_2heads", [] { return ModulePtr(new nn::CausalSelfAttention({.dim = 16, .heads = 2})); },
       Shape{2, 7, 16}, kCompositeTolerance},
      {"attention_t1", [] { return ModulePtr(new nn::CausalSelfAttention({.dim = 8, .heads = 2})); }, Shape{3, 1, 8},
       kCompositeTolerance},
      {"transformer_block", [] { return ModulePtr(new nn::TransformerBlock({.dim = 16, .heads = 2})); }, Shape{2, 9, 16},
       kCompositeTolerance, false, true},
      {"transformer_block_unfused_gelu", [] { return ModulePtr(new nn::TransformerBlock({.dim = 5, .heads = 1})); },
       Shape{2, 6, 5}, kCompositeTolerance, false, true},
      {"gpt_2_layers",
       [] { return ModulePtr(new nn::Gpt({.vocab = 5, .layers = 2, .heads = 2, .dim = 16, .context = 7})); },
       Shape{3, 6}, kCompositeTolerance, true, false},
  };
}

// The blocks of a GPT hold one set of gradient buffers between them
// (TransformerBlock::shareBackwardBuffers). After two bf16 steps, each block beyond the first adds to
// the peak its parameters (values, gradients and bf16 copies: 10 bytes each) and what its forward
// keeps for backward (about 40 bytes per activation element: LayerNorms' outputs, qkv, y, the MLP's
// two 4D activations in bf16, the fp32 residual stream), bounded here by 64 bytes per element; a
// block with gradient buffers of its own would add about 48 bytes per element more.
TEST(Bf16Layers, GptBlocksShareOneSetOfGradientBuffers) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t batch = 4, time = 32, dim = 64;
  auto peakBytes = [&](int64_t layers) {
    runtime::cuda::GpuContext gpu(Device::cuda(0));
    runtime::Rng rng(1);
    TwinModules twins(
        [&] { return ModulePtr(new nn::Gpt({.vocab = 16, .layers = layers, .heads = 2, .dim = dim, .context = time})); },
        gpu, rng);
    Tensor ids = Tensor::zeros(Shape{batch, time});
    for (int64_t i = 0; i < ids.numel(); ++i) ids.at(i) = static_cast<float>(i % 16);
    const Tensor dids = ids.clone(gpu.allocator());
    nn::Pass pass;
    pass.gpu = &gpu;
    pass.precision = DType::kBF16;
    for (int step = 0; step < 2; ++step) {
      const Tensor& logits = twins.dev->forward(dids, pass);
      const Tensor dy = Tensor::empty(logits.shape(), gpu.allocator());
      runtime::cuda::fill({dy.data(), static_cast<size_t>(dy.numel())}, 0.0f, gpu.stream());
      twins.dev->backward(dy, pass);
    }
    gpu.stream().synchronize();
    return static_cast<double>(gpu.allocator().stats().peakAllocatedBytes);
  };
  const double perBlock = (peakBytes(3) - peakBytes(1)) / 2;
  const double params = 12.0 * dim * dim + 13.0 * dim, elements = static_cast<double>(batch * time * dim);
  const double bytesPerElement = (perBlock - 10 * params) / elements;
  std::printf("each block adds %.0f bytes: 10 per parameter and %.1f per activation element\n", perBlock,
              bytesPerElement);
  EXPECT_LT(bytesPerElement, 64.0);
}

// A bf16 pass's GPT writes bf16 logits. Model::forward hands them as they are to a loss that reads
// bf16 (keepBf16) and widens them otherwise; the loss of either is the same, and the bf16 gradient
// the loss writes goes back through the model. An fp32 pass keeps fp32 whatever is asked.
TEST(Bf16Layers, GptHandsTheLossBf16Logits) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  const auto make = [] {
    return ModulePtr(new nn::Gpt({.vocab = 16, .layers = 1, .heads = 2, .dim = 32, .context = 8}));
  };
  nn::Model host(make(), {.name = "gpt"}), dev(make(), {.name = "gpt"});
  host.params.allocate(runtime::cpuAllocator());
  dev.params.allocate(gpu.allocator());
  runtime::Rng rng(3);
  host.net->resetParams(rng);
  dev.params.values().copyFrom(host.params.values());
  Tensor ids = Tensor::zeros(Shape{2, 8}), targets = Tensor::zeros(Shape{2, 8});
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ids.at(i) = static_cast<float>((i * 5) % 16);
    targets.at(i) = static_cast<float>((i * 5 + 1) % 16);
  }
  const Tensor dids = ids.clone(gpu.allocator()), dtargets = targets.clone(gpu.allocator());
  nn::Pass pass;
  pass.gpu = &gpu;
  pass.precision = DType::kBF16;
  nn::SoftmaxCrossEntropy loss;
  loss.setGradType(DType::kBF16);
  ASSERT_TRUE(loss.readsBf16());
  const Tensor& kept = dev.forward(dids, pass, loss.readsBf16());
  EXPECT_EQ(kept.dtype(), DType::kBF16);
  loss.forwardGpu(kept, dtargets, gpu);
  const double fromBf16 = loss.takeGpuSums(gpu).loss;
  EXPECT_EQ(loss.backward().dtype(), DType::kBF16);
  dev.backward(loss.backward(), pass);
  const Tensor& widened = dev.forward(dids, pass);
  EXPECT_EQ(widened.dtype(), DType::kF32);
  loss.forwardGpu(widened, dtargets, gpu);
  const double fromWidened = loss.takeGpuSums(gpu).loss;
  EXPECT_GT(fromBf16, 1.0);
  EXPECT_NEAR(fromWidened, fromBf16, 1e-6 * fromBf16);
  pass.precision = DType::kF32;
  EXPECT_EQ(dev.forward(dids, pass, true).dtype(), DType::kF32);
}

INSTANTIATE_TEST_SUITE_P(Layers, Bf16LayersTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Bf16Case>& info) { return info.param.name; });
#else
TEST(Bf16Layers, NeedCuda) { GTEST_SKIP() << "no CUDA device: CUDA support not compiled in"; }
#endif

}  // namespace
}  // namespace cohort::testing
