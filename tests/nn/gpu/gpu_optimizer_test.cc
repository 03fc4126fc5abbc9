// The GPU optimizer's whole-buffer steps (nn/optimizer.h; tags = ["gpu"]: the emulated device in CI):
// one multi-tensor kernel over the chunk table ends bit for bit where the per-run kernels
// (runtime/cuda sgdStep, adamStep: one launch per parameter-group run) end, for SGD with momentum,
// Adam and AdamW, over groups of other weight decays and lr scales that begin unaligned and span
// several chunks, stepped plainly (step()) and deferred (stepDeferred: applied with a multiplier,
// not applied, applied after a step the host has not read); and the bf16 copy it writes
// (setHalfCopy) is convertToBf16 of the new parameters after every step, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "nn/optimizer.h"
#include "runtime/error.h"
#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/gpu_context.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/precision_kernels.h"

namespace cohort::nn {
namespace {

using runtime::Shape;
using runtime::Tensor;

constexpr size_t kNumel = 140003;
// The runs of the groups below (and of the default between them): begin, end, decay, lr scale.
const std::vector<ParamGroup> kRuns = {{0, 1001, 0.01f, 1.0f},
                                       {1001, 70001, 0.1f, 1.0f},
                                       {70001, 70003, 0.01f, 1.0f},
                                       {70003, 140000, 0.0f, 0.5f},
                                       {140000, kNumel, 0.01f, 1.0f}};

OptimizerOptions optionsFor(OptimizerKind kind) {
  return {.kind = kind, .lr = 0.01f, .momentum = kind == OptimizerKind::kSgd ? 0.9f : 0.0f, .weightDecay = 0.01f,
          .groups = {kRuns[1], kRuns[3]}};
}

Tensor onDevice(const std::vector<float>& values, runtime::cuda::GpuContext& gpu) {
  Tensor t = Tensor::empty(Shape{static_cast<int64_t>(values.size())}, gpu.allocator());
  t.copyFrom(Tensor::view(const_cast<float*>(values.data()), Shape{static_cast<int64_t>(values.size())}));
  return t;
}

std::vector<float> pattern(size_t n, int salt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i * 13 + salt)) * (i % 7 == 0 ? 3.0f : 0.25f);
  return v;
}

std::vector<uint32_t> bitsOf(const Tensor& t, runtime::cuda::GpuContext& gpu, size_t bytes) {
  gpu.stream().synchronize();
  std::vector<uint32_t> bits((bytes + 3) / 4);
  runtime::cuda::copyToHost(bits.data(), t.data(), bytes, gpu.stream());
  gpu.stream().synchronize();
  return bits;
}

// The reference: the per-run kernels, each run with its own options, on buffers of its own.
struct Reference {
  OptimizerOptions o;
  Tensor params, state0, state1;
  std::vector<ParamGroup> runs = kRuns;

  void step(const Tensor& grads, int64_t steps, float lr, runtime::cuda::GpuContext& gpu) {
    for (const ParamGroup& run : runs) {
      const float runLr = run.lrScale == 1.0f ? lr : static_cast<float>(static_cast<double>(lr) * run.lrScale);
      const auto n = static_cast<int64_t>(run.end - run.begin);
      float* p = params.data() + run.begin;
      const float* g = grads.data() + run.begin;
      if (o.kind == OptimizerKind::kSgd) {
        runtime::cuda::sgdStep({.param = {p, static_cast<size_t>(n)},
                                .grad = {g, static_cast<size_t>(n)},
                                .momentumBuffer = {state0.data() + run.begin, static_cast<size_t>(n)}},
                               {.lr = runLr, .momentum = o.momentum, .weightDecay = run.weightDecay,
                                .firstStep = steps == 0},
                               gpu.stream());
        continue;
      }
      const bool decoupled = o.kind == OptimizerKind::kAdamW;
      const double t = static_cast<double>(steps + 1);
      runtime::cuda::AdamStepOptions a{.beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps,
                                       .decay = decoupled ? 1.0f - runLr * run.weightDecay : 1.0f,
                                       .coupledWeightDecay = decoupled ? 0.0f : run.weightDecay};
      a.stepSize = static_cast<float>(runLr / (1.0 - std::pow(static_cast<double>(o.beta1), t)));
      a.bc2Sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(o.beta2), t)));
      runtime::cuda::adamStep(p, g, state0.data() + run.begin, state1.data() + run.begin, n, a, gpu.stream());
    }
  }
};

class GpuOptimizerTest : public ::testing::TestWithParam<OptimizerKind> {
 protected:
  void SetUp() override {
    COHORT_SKIP_WITHOUT_CUDA_DEVICE();
    gpu_ = std::make_unique<runtime::cuda::GpuContext>(runtime::Device::cuda(0));
    optimizer_ = makeOptimizer(optionsFor(GetParam()), kNumel, gpu_.get());
    params_ = onDevice(pattern(kNumel, 1), *gpu_);
    grads_ = onDevice(pattern(kNumel, 2), *gpu_);
    ref_ = {.o = optionsFor(GetParam()), .params = onDevice(pattern(kNumel, 1), *gpu_),
            .state0 = onDevice(std::vector<float>(kNumel), *gpu_), .state1 = onDevice(std::vector<float>(kNumel), *gpu_)};
    half_ = Tensor::empty(Shape{static_cast<int64_t>(kNumel / 2 + 1)}, gpu_->allocator());
    halfWant_ = Tensor::empty(half_.shape(), gpu_->allocator());
    optimizer_->setHalfCopy(half_.data());
  }

  // The optimizer's parameters and state against the reference's, and its bf16 copy against
  // convertToBf16 of its parameters, all bit for bit.
  void expectSame(const char* when) {
    SCOPED_TRACE(when);
    EXPECT_EQ(bitsOf(params_, *gpu_, kNumel * 4), bitsOf(ref_.params, *gpu_, kNumel * 4));
    const std::vector<Optimizer::StateTensor> state = optimizer_->state();
    ASSERT_EQ(state.size(), GetParam() == OptimizerKind::kSgd ? 1u : 2u);
    EXPECT_EQ(bitsOf(state[0].tensor, *gpu_, kNumel * 4), bitsOf(ref_.state0, *gpu_, kNumel * 4));
    if (state.size() == 2) {
      EXPECT_EQ(bitsOf(state[1].tensor, *gpu_, kNumel * 4), bitsOf(ref_.state1, *gpu_, kNumel * 4));
    }
    runtime::cuda::convertToBf16(params_.data(), halfWant_.data(), static_cast<int64_t>(kNumel), gpu_->stream());
    EXPECT_EQ(bitsOf(half_, *gpu_, kNumel * 2), bitsOf(halfWant_, *gpu_, kNumel * 2));
  }

  // A StepControl in device memory.
  const runtime::cuda::StepControl* control(int apply, float multiplier, long long appliedBefore) {
    const runtime::cuda::StepControl c{.apply = apply, .gradMultiplier = multiplier, .appliedBefore = appliedBefore};
    control_ = Tensor::empty(Shape{8}, gpu_->allocator());
    runtime::cuda::copyToDevice(control_.data(), &c, sizeof c, gpu_->stream());
    return static_cast<const runtime::cuda::StepControl*>(static_cast<const void*>(control_.data()));
  }

  std::unique_ptr<runtime::cuda::GpuContext> gpu_;
  std::unique_ptr<Optimizer> optimizer_;
  Tensor params_, grads_, half_, halfWant_, control_;
  Reference ref_;
};

TEST_P(GpuOptimizerTest, OneKernelStepsAsThePerRunKernels) {
  for (int64_t s = 0; s < 3; ++s) {
    const float lr = 0.01f / static_cast<float>(s + 1);
    optimizer_->setLr(lr);
    optimizer_->step(params_, grads_);
    ref_.step(grads_, s, lr, *gpu_);
    expectSame("step");
  }
  EXPECT_EQ(optimizer_->steps(), 3);
}

TEST_P(GpuOptimizerTest, DeferredStepsAsThePerRunKernelsOfTheScaledGradient) {
  optimizer_->setSteps(2);
  const Tensor scaled = onDevice(pattern(kNumel, 2), *gpu_);
  runtime::cuda::scale({scaled.data(), kNumel}, 0.5f, gpu_->stream());
  // Applied, the settled count, the gradient halved.
  optimizer_->stepDeferred(params_, grads_, {.control = control(1, 0.5f, 2), .lrIfSettled = 0.01f, .lrIfOneMore = 0.02f});
  ref_.step(scaled, 2, 0.01f, *gpu_);
  expectSame("applied");
  // Not applied: nothing moves, the bf16 copy included.
  optimizer_->stepDeferred(params_, grads_, {.control = control(0, 1.0f, 3), .lrIfSettled = 0.01f, .lrIfOneMore = 0.02f});
  expectSame("not applied");
  // Applied after a step the host has not read: one more step and its learning rate.
  optimizer_->stepDeferred(params_, grads_, {.control = control(1, 1.0f, 3), .lrIfSettled = 0.01f, .lrIfOneMore = 0.02f});
  ref_.step(grads_, 3, 0.02f, *gpu_);
  expectSame("one more");
}

// More distinct (decay, lr scale) pairs than one store of the step's rates holds (16: layer-wise
// learning rates, say): 40 groups of their own, and the default between them, in one kernel.
TEST_P(GpuOptimizerTest, ManyGroupsStepAsThePerRunKernels) {
  OptimizerOptions o = optionsFor(GetParam());
  o.groups.clear();
  ref_.runs.clear();
  for (size_t i = 0; i < 40; ++i) {
    const ParamGroup g{.begin = i * 3000 + 7, .end = i * 3000 + 2507, .weightDecay = 0.001f * static_cast<float>(i),
                       .lrScale = 1.0f + 0.01f * static_cast<float>(i)};
    o.groups.push_back(g);
    ref_.runs.push_back({.begin = i == 0 ? 0 : (i - 1) * 3000 + 2507, .end = g.begin, .weightDecay = o.weightDecay});
    ref_.runs.push_back(g);
  }
  ref_.runs.push_back({.begin = 39 * 3000 + 2507, .end = kNumel, .weightDecay = o.weightDecay});
  ref_.o = o;
  optimizer_ = makeOptimizer(o, kNumel, gpu_.get());
  optimizer_->setHalfCopy(half_.data());
  for (int64_t s = 0; s < 2; ++s) {
    optimizer_->setLr(0.01f);
    optimizer_->step(params_, grads_);
    ref_.step(grads_, s, 0.01f, *gpu_);
    expectSame("step");
  }
  // Deferred, applied after a step the host has not read: the second block's rates too.
  optimizer_->stepDeferred(params_, grads_, {.control = control(1, 0.5f, 3), .lrIfSettled = 0.01f, .lrIfOneMore = 0.02f});
  const Tensor scaled = onDevice(pattern(kNumel, 2), *gpu_);
  runtime::cuda::scale({scaled.data(), kNumel}, 0.5f, gpu_->stream());
  ref_.step(scaled, 3, 0.02f, *gpu_);
  expectSame("one more");
}

INSTANTIATE_TEST_SUITE_P(Kinds, GpuOptimizerTest,
                         ::testing::Values(OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdamW));

TEST(GpuOptimizer, HalfCopyOnlyForAWholeBufferGpuOptimizer) {
  auto cpu = makeOptimizer({.kind = OptimizerKind::kAdamW}, 16);
  EXPECT_THROW(cpu->setHalfCopy(nullptr), InvalidArgument);
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  runtime::cuda::GpuContext gpu(runtime::Device::cuda(0));
  const ShardMap map({{.name = "w", .numel = 16}}, {.worldSize = 2, .rank = 0});
  auto shard = makeShardOptimizer({.kind = OptimizerKind::kAdamW}, map, &gpu);
  EXPECT_THROW(shard->setHalfCopy(nullptr), InvalidArgument);
}

}  // namespace
}  // namespace cohort::nn

#endif  // COHORT_HAVE_CUDA
