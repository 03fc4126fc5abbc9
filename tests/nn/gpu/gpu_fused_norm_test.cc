// LayerNorm's "add then normalise" on a GPU (runtime/cuda/norm_kernels.h's fused kernels, through
// nn::LayerNorm::forwardAdded and backwardAdded) against the same on the CPU (addInto, then the
// layer), in fp32 and bf16 passes (tags = ["gpu"]; skips with the reason when no CUDA device is
// usable): the sum, output, statistics, the input gradient plus the residual gradient, its bf16
// copy (exactly the fp32 result rounded once) and the parameter gradients, over widths that take
// each path: odd, not a multiple of 8 (the scalar tail), a warp's held chunks 1 to 4, a block's
// row, and one past a block's held chunks (8192 columns, read again). A second run must give the
// same bits (the emulated device runs blocks in a shuffled order).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nn/layer_norm.h"
#include "runtime/dtype.h"
#include "runtime/random.h"
#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#include "runtime/cuda/precision_kernels.h"
#include "tests/nn/gpu/gpu_compare.h"
#endif

namespace cohort::testing {
namespace {

#ifdef COHORT_HAVE_CUDA
using runtime::Device;
using runtime::DType;
using runtime::Shape;
using runtime::Tensor;

constexpr double kTolerance = 1e-5;
constexpr double kBf16Output = 1.0 / 128;  // one bf16 rounding of the output

struct FusedCase {
  std::string name;
  int64_t rows, features;
  bool bf16;
};

std::ostream& operator<<(std::ostream& os, const FusedCase& c) { return os << c.name; }

// Values bf16 holds exactly, so that a bf16 copy on the GPU and the fp32 tensor on the CPU agree.
Tensor randomHost(const Shape& shape, runtime::Rng& rng, float lo, float hi) {
  Tensor t = Tensor::zeros(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.at(i) = runtime::roundToBf16(rng.uniform(lo, hi));
  return t;
}

// `host` on the GPU, in bf16 when asked.
Tensor onGpu(const Tensor& host, bool bf16, runtime::cuda::GpuContext& gpu) {
  Tensor fp32 = host.clone(gpu.allocator());
  if (!bf16) return fp32;
  Tensor half;
  runtime::ensureShape(half, host.shape(), gpu.allocator(), DType::kBF16);
  runtime::cuda::convertToBf16(fp32.data(), half.raw(), fp32.numel(), gpu.stream());
  gpu.stream().synchronize();
  return half;
}

// A host fp32 copy of a GPU tensor of either type.
Tensor widened(const Tensor& t, runtime::cuda::GpuContext& gpu) {
  if (t.dtype() == DType::kF32) return toHost(t, gpu);
  Tensor wide;
  runtime::ensureShape(wide, t.shape(), gpu.allocator());
  runtime::cuda::convertToFloat(t.raw(), wide.data(), t.numel(), gpu.stream());
  return toHost(wide, gpu);
}

class GpuFusedNormTest : public ::testing::TestWithParam<FusedCase> {
 protected:
  void SetUp() override { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_P(GpuFusedNormTest, MatchesTheCpuAndRepeats) {
  const FusedCase& c = GetParam();
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  runtime::Rng rng(21);
  TwinModules twins([&] { return std::make_unique<nn::LayerNorm>(c.features); }, gpu, rng);
  auto& cpuLn = static_cast<nn::LayerNorm&>(*twins.cpu);
  auto& devLn = static_cast<nn::LayerNorm&>(*twins.dev);
  const Shape shape{c.rows, c.features};
  const Tensor residual = randomHost(shape, rng, -3.0f, 3.0f), branch = randomHost(shape, rng, -2.0f, 2.5f);
  const Tensor dy = randomHost(shape, rng, -1.0f, 1.0f), residualGrad = randomHost(shape, rng, -1.0f, 1.0f);
  const Tensor devResidual = onGpu(residual, false, gpu), devBranch = onGpu(branch, c.bf16, gpu);
  const Tensor devDy = onGpu(dy, c.bf16, gpu), devResidualGrad = onGpu(residualGrad, false, gpu);
  nn::Pass cpuPass, devPass;
  devPass.gpu = &gpu;
  if (c.bf16) devPass.precision = DType::kBF16;

  Tensor cpuSum, cpuGrad;
  const Tensor& yc = cpuLn.forwardAdded({.residual = residual, .branch = branch, .sum = cpuSum}, cpuPass);
  cpuLn.backwardAdded(dy, {.residualGrad = &residualGrad, .out = &cpuGrad}, cpuPass);

  // Twice on the GPU: the second run must repeat the first's bits.
  std::vector<Tensor> runs[2];
  for (auto& run : runs) {
    Tensor sum, grad, grad16;
    const Tensor& y = devLn.forwardAdded({.residual = devResidual, .branch = devBranch, .sum = sum}, devPass);
    run.push_back(toHost(sum, gpu));
    run.push_back(widened(y, gpu));
    run.push_back(toHost(devLn.mean(), gpu));
    run.push_back(toHost(devLn.rstd(), gpu));
    const Tensor& g =
        devLn.backwardAdded(devDy, {.residualGrad = &devResidualGrad, .out = &grad, .out16 = &grad16}, devPass);
    EXPECT_EQ(&g, &grad);
    run.push_back(toHost(grad, gpu));
    run.push_back(toHost(twins.devParams.grads(), gpu));
    EXPECT_EQ(grad16.defined(), c.bf16);
    if (c.bf16) run.push_back(widened(grad16, gpu));
  }
  const std::vector<Tensor>& first = runs[0];
  expectClose(cpuSum, first[0], 0, "residual + branch");
  expectClose(yc, first[1], c.bf16 ? kBf16Output : kTolerance, "output");
  expectClose(cpuLn.mean(), first[2], kTolerance, "mean");
  expectClose(cpuLn.rstd(), first[3], kTolerance, "rstd");
  expectClose(cpuGrad, first[4], kTolerance, "residual gradient + input gradient");
  expectClose(twins.cpuParams.grads(), first[5], kTolerance, "parameter gradients");
  if (c.bf16) {
    Tensor rounded = first[4].clone();
    for (int64_t i = 0; i < rounded.numel(); ++i) rounded.at(i) = runtime::roundToBf16(rounded.at(i));
    expectClose(rounded, first[6], 0, "the gradient's bf16 copy");
  }
  ASSERT_EQ(runs[1].size(), first.size());
  for (size_t i = 0; i < first.size(); ++i) expectClose(first[i], runs[1][i], 0, "run 2, result " + std::to_string(i));
}

std::vector<FusedCase> cases() {
  std::vector<FusedCase> out;
  const std::vector<FusedCase> shapes = {
      {"one_feature", 5, 1, false},      {"odd", 9, 7, false},          {"tail_33", 4, 33, false},
      {"gpt_768", 70, 768, false},       {"warp_1001", 3, 1001, false}, {"block_1025", 2, 1025, false},
      {"block_3000", 3, 3000, false},    {"past_held_8203", 2, 8203, false},
  };
  for (const FusedCase& s : shapes) {
    out.push_back({s.name + "_fp32", s.rows, s.features, false});
    out.push_back({s.name + "_bf16", s.rows, s.features, true});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Widths, GpuFusedNormTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<FusedCase>& info) { return info.param.name; });
#else
TEST(GpuFusedNorm, NeedCuda) { GTEST_SKIP() << "no CUDA device: CUDA support not compiled in"; }
#endif

}  // namespace
}  // namespace cohort::testing
