// Gelu and LayerNorm on a GPU against the same layers on the CPU (tags = ["gpu"]; skips with the
// reason when no CUDA device is usable): identical parameters and input must give the same output,
// LayerNorm's per-row mean and rstd, input gradient and parameter gradients (overwritten, then
// accumulated, then without an input gradient) to float32 rounding, over shapes that take each
// kernel path: one feature, odd widths, the float4 and scalar GELU loops, a warp per row (up to 1024
// features) and a block per row, and enough rows for several, and for more than 64-row, chunks of
// the parameter-gradient reduction. LayerNorm's parameter gradients must also be the same bits on
// every run (the emulated device runs blocks in a shuffled order). The CPU layers are checked
// against finite differences in tests/nn/gelu_layernorm_test.cc.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "nn/gelu.h"
#include "nn/layer_norm.h"
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

#ifdef COHORT_HAVE_CUDA
using nn::ModulePtr;
using runtime::Device;
using runtime::Shape;
using runtime::Tensor;

// Both compute in float with the same operation order; FMA contraction and tanhf differ by ulps.
constexpr double kTolerance = 1e-5;

struct NormCase {
  std::string name;
  std::function<ModulePtr()> make;
  Shape input;
};

std::ostream& operator<<(std::ostream& os, const NormCase& c) { return os << c.name; }

// One module on the CPU and one on the GPU with the same parameters (moved off LayerNorm's 1 and 0
// so that every one matters).
struct Pair {
  explicit Pair(const NormCase& c, runtime::cuda::GpuContext& gpu) : cpu(c.make()), dev(c.make()) {
    cpu->registerParams(cpuParams, "");
    dev->registerParams(devParams, "");
    cpuParams.allocate(runtime::cpuAllocator());
    devParams.allocate(gpu.allocator());
    runtime::Rng rng(11);
    cpu->resetParams(rng);
    for (int64_t i = 0; i < cpuParams.values().numel(); ++i) cpuParams.values().at(i) += rng.uniform(-0.5f, 0.5f);
    if (cpuParams.numel() > 0) {
      devParams.values().copyFrom(cpuParams.values());
      runtime::cuda::fill({devParams.grads().data(), static_cast<size_t>(devParams.numel())}, 0.0f, gpu.stream());
    }
  }
  ModulePtr cpu, dev;
  nn::ParamBuffer cpuParams, devParams;
};

Tensor randomHost(const Shape& shape, runtime::Rng& rng, float lo, float hi) {
  Tensor t = Tensor::zeros(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.at(i) = rng.uniform(lo, hi);
  return t;
}

class GpuNormTest : public ::testing::TestWithParam<NormCase> {
 protected:
  void SetUp() override { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_P(GpuNormTest, MatchesTheCpu) {
  const NormCase& c = GetParam();
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  Pair p(c, gpu);
  runtime::Rng rng(12);
  // Rows with an offset and a spread of their own, as activations entering a LayerNorm have.
  Tensor x = randomHost(c.input, rng, -3.0f, 3.0f);
  const int64_t d = c.input[c.input.rank() - 1];
  for (int64_t i = 0; i < x.numel(); ++i) x.at(i) = x.at(i) * (1.0f + (i / d) % 3) + 0.25f * ((i / d) % 5);
  Tensor dx = x.clone(gpu.allocator());
  nn::Pass cpuPass, devPass;
  devPass.gpu = &gpu;

  const Tensor& yc = p.cpu->forward(x, cpuPass);
  const Tensor& yg = p.dev->forward(dx, devPass);
  ASSERT_TRUE(yg.device().isCuda());
  expectClose(yc, toHost(yg, gpu), kTolerance, "output");
  if (auto* ln = dynamic_cast<nn::LayerNorm*>(p.cpu.get())) {
    auto* lg = dynamic_cast<nn::LayerNorm*>(p.dev.get());
    expectClose(ln->mean(), toHost(lg->mean(), gpu), kTolerance, "mean");
    expectClose(ln->rstd(), toHost(lg->rstd(), gpu), kTolerance, "rstd");
  }

  Tensor dy = randomHost(yc.shape(), rng, -1.0f, 1.0f);
  Tensor ddy = dy.clone(gpu.allocator());
  for (bool accumulate : {false, true}) {
    cpuPass.accumulateGrads = devPass.accumulateGrads = accumulate;
    const std::string when = accumulate ? " (accumulated)" : " (overwritten)";
    const Tensor& gc = p.cpu->backward(dy, cpuPass);
    const Tensor& gg = p.dev->backward(ddy, devPass);
    expectClose(gc, toHost(gg, gpu), kTolerance, "input gradient" + when);
    if (p.cpuParams.numel() > 0)
      expectClose(p.cpuParams.grads(), toHost(p.devParams.grads(), gpu), kTolerance, "parameter gradients" + when);
  }
  // Without an input gradient the parameter gradients still come.
  cpuPass.needInputGrad = devPass.needInputGrad = false;
  cpuPass.accumulateGrads = devPass.accumulateGrads = false;
  EXPECT_FALSE(p.dev->backward(ddy, devPass).defined());
  p.cpu->backward(dy, cpuPass);
  if (p.cpuParams.numel() > 0) {
    expectClose(p.cpuParams.grads(), toHost(p.devParams.grads(), gpu), kTolerance,
                "parameter gradients without input gradient");
    // The reduction's order is fixed: another run gives the same bits.
    const Tensor first = toHost(p.devParams.grads(), gpu);
    p.dev->forward(dx, devPass);
    p.dev->backward(ddy, devPass);
    expectClose(first, toHost(p.devParams.grads(), gpu), 0, "parameter gradients of a second run");
  }
}

ModulePtr layerNorm(int64_t d) { return std::make_unique<nn::LayerNorm>(d); }

std::vector<NormCase> cases() {
  return {
      {"gelu_one", [] { return nn::gelu(); }, Shape{1}},
      {"gelu_odd", [] { return nn::gelu(); }, Shape{7, 33}},
      {"gelu_tail", [] { return nn::gelu(); }, Shape{4, 257}},
      {"gelu_gpt", [] { return nn::gelu(); }, Shape{3, 5, 3072}},
      {"layernorm_one_feature", [] { return layerNorm(1); }, Shape{5, 1}},
      {"layernorm_odd", [] { return layerNorm(7); }, Shape{3, 4, 7}},
      {"layernorm_single_row", [] { return layerNorm(33); }, Shape{33}},
      {"layernorm_gpt_warp", [] { return layerNorm(768); }, Shape{2, 9, 768}},
      {"layernorm_warp_widest", [] { return layerNorm(1024); }, Shape{3, 1024}},
      {"layernorm_block_odd", [] { return layerNorm(1025); }, Shape{2, 1025}},
      {"layernorm_block_wide", [] { return layerNorm(3000); }, Shape{3, 3000}},
      {"layernorm_many_chunks", [] { return layerNorm(40); }, Shape{7, 100, 40}},
      {"layernorm_long_chunks", [] { return layerNorm(3); }, Shape{66001, 3}},
  };
}

INSTANTIATE_TEST_SUITE_P(Layers, GpuNormTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<NormCase>& info) { return info.param.name; });

TEST(GpuLayerNorm, NoRowsGivesZeroGradients) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  Pair p({"no_rows", [] { return layerNorm(5); }, Shape{0, 5}}, gpu);
  runtime::cuda::fill({p.devParams.grads().data(), static_cast<size_t>(p.devParams.numel())}, 3.0f, gpu.stream());
  nn::Pass pass;
  pass.gpu = &gpu;
  Tensor x = Tensor::empty(Shape{0, 5}, gpu.allocator());
  EXPECT_EQ(p.dev->forward(x, pass).numel(), 0);
  EXPECT_EQ(p.dev->backward(x, pass).numel(), 0);
  const Tensor grads = toHost(p.devParams.grads(), gpu);
  for (const auto& e : p.devParams.entries()) {
    for (size_t k = 0; k < e.numel; ++k) EXPECT_EQ(grads.at(e.offset + k), 0.0f) << e.name << k;
  }
}

TEST(GpuLayerNorm, RefusesAnotherLastDimension) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  Pair p({"mismatch", [] { return layerNorm(5); }, Shape{2, 5}}, gpu);
  nn::Pass pass;
  pass.gpu = &gpu;
  EXPECT_THROW(p.dev->forward(Tensor::empty(Shape{2, 4}, gpu.allocator()), pass), InvalidArgument);
  nn::Pass noGpu;
  EXPECT_THROW(p.dev->forward(Tensor::empty(Shape{2, 5}, gpu.allocator()), noGpu), InvalidArgument);
}
#else
TEST(GpuNorm, NeedCuda) { GTEST_SKIP() << "no CUDA device: CUDA support not compiled in"; }
#endif

}  // namespace
}  // namespace cohort::testing
