// Activation recompute on a GPU (issue 46, item 2; tags = ["gpu"], on the emulated device in
// scripts/test): a GPT's gradients, logits and input path are bit for bit the same in every
// recompute mode, in fp32 and bf16 passes, over two accumulated micro-batches; nn::Recompute around
// a Sequential with dropout replays the GPU's masks; with full recompute the device's peak
// allocation is lower. Skips with the reason without a CUDA device.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "nn/dropout.h"
#include "nn/gelu.h"
#include "nn/gpt.h"
#include "nn/linear.h"
#include "nn/recompute.h"
#include "nn/sequential.h"
#include "runtime/dtype.h"
#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#include "tests/nn/gpu/gpu_compare.h"
#include "tests/nn/token_ids.h"
#endif

namespace cohort::nn {
namespace {

#ifdef COHORT_HAVE_CUDA
using runtime::Device;
using runtime::DType;
using runtime::Shape;
using runtime::Tensor;
using testing::toHost;
using testing::TwinModules;

bool sameBits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

struct Outcome {
  Tensor grads, output;
  double peakBytes = 0;
};

// Two accumulated micro-batches on the device; the output gradient a fixed small value per element.
Outcome train(TwinModules& twins, runtime::cuda::GpuContext& gpu, const std::vector<Tensor>& inputs, DType precision,
              const std::function<void()>& between = nullptr) {
  runtime::Rng rng(5);
  Outcome o;
  runtime::cuda::fill({twins.devParams.grads().data(), static_cast<size_t>(twins.devParams.numel())}, 0.0f,
                      gpu.stream());
  // The device copies live until the stream is done with them: a host copy into memory the
  // allocator handed out again would not wait for the kernels still reading it.
  for (const Tensor& input : inputs) {
    const Pass pass{.training = true, .accumulateGrads = true, .rng = &rng, .gpu = &gpu, .precision = precision};
    const Tensor x = input.clone(gpu.allocator());
    const Tensor& y = twins.dev->forward(x, pass);
    o.output = toHost(y, gpu);
    Tensor g = Tensor::zeros(y.shape());
    for (int64_t k = 0; k < g.numel(); ++k) g.at(k) = static_cast<float>(k % 5) * 1e-2f - 0.02f;
    if (between) between();
    const Tensor dy = g.clone(gpu.allocator());
    twins.dev->backward(dy, pass);
    gpu.stream().synchronize();
  }
  o.grads = toHost(twins.devParams.grads(), gpu);
  o.peakBytes = static_cast<double>(gpu.allocator().stats().peakAllocatedBytes);
  return o;
}

using cohort::testing::randomTokenIds;

Tensor values(const Shape& shape, uint64_t seed) {
  runtime::Rng rng(seed);
  Tensor t = Tensor::zeros(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.at(i) = rng.uniform(-1.0f, 1.0f);
  return t;
}

class GpuRecomputeTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_P(GpuRecomputeTest, GptGivesTheSameBitsInEveryMode) {
  const DType precision = GetParam();
  const std::vector<Tensor> inputs{randomTokenIds(2, 8, 16, 1), randomTokenIds(2, 8, 16, 2)};
  Outcome reference;
  for (RecomputeMode mode : {RecomputeMode::kNone, RecomputeMode::kSelective, RecomputeMode::kFull}) {
    SCOPED_TRACE(recomputeName(mode));
    runtime::cuda::GpuContext gpu(Device::cuda(0));
    runtime::Rng init(3);
    TwinModules twins(
        [&] {
          return ModulePtr(new Gpt({.vocab = 16, .layers = 3, .heads = 2, .dim = 32, .context = 8, .recompute = mode}));
        },
        gpu, init);
    const Outcome got = train(twins, gpu, inputs, precision);
    if (mode == RecomputeMode::kNone) {
      reference = got;
      continue;
    }
    EXPECT_TRUE(sameBits(reference.grads, got.grads));
    EXPECT_TRUE(sameBits(reference.output, got.output));
    if (mode == RecomputeMode::kFull) EXPECT_LT(got.peakBytes, reference.peakBytes);
  }
}

// Dropout's GPU masks come from one draw of the pass's Rng each; the recompute replays them, while
// the wrapped module ran on other data with other masks between forward and backward.
TEST_P(GpuRecomputeTest, WrappedSequentialWithDropoutGivesTheSameBits) {
  const DType precision = GetParam();
  auto make = [](bool wrap) {
    auto s = std::make_unique<Sequential>();
    s->add(std::make_unique<Linear>(6, 16), "fc0").add(std::make_unique<Dropout>(0.5f), "drop");
    s->add(gelu(), "gelu").add(std::make_unique<Linear>(16, 4), "fc1");
    return wrap ? ModulePtr(std::make_unique<Recompute>(std::move(s))) : ModulePtr(std::move(s));
  };
  const std::vector<Tensor> inputs{values(Shape{4, 6}, 1), values(Shape{4, 6}, 2)};
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  runtime::Rng initPlain(4), initWrapped(4), other(99);
  TwinModules plain([&] { return make(false); }, gpu, initPlain), wrapped([&] { return make(true); }, gpu, initWrapped);
  const Outcome a = train(plain, gpu, inputs, precision);
  auto& recompute = dynamic_cast<Recompute&>(*wrapped.dev);
  const Tensor otherInput = values(Shape{4, 6}, 7).clone(gpu.allocator());
  const Outcome b = train(wrapped, gpu, inputs, precision, [&] {
    recompute.inner().forward(otherInput, {.training = true, .rng = &other, .gpu = &gpu, .precision = precision});
    gpu.stream().synchronize();
  });
  EXPECT_TRUE(sameBits(a.grads, b.grads));
  EXPECT_TRUE(sameBits(a.output, b.output));
}

INSTANTIATE_TEST_SUITE_P(Precisions, GpuRecomputeTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& info) { return runtime::dtypeName(info.param); });
#else
TEST(GpuRecompute, NeedCuda) { GTEST_SKIP() << "no CUDA device: CUDA support not compiled in"; }
#endif

}  // namespace
}  // namespace cohort::nn
