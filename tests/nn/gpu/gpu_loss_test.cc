// nn::SoftmaxCrossEntropy on a GPU (runtime/cuda/cross_entropy_kernels.cu) against its CPU
// forward(): the loss, the correct count and the gradient, for fp32 and bf16 logits, the gradient
// written apart or over the logits (Loss::setGradInPlace), widths that are and are not multiples of
// the kernel's 8-column packs, a warp or a block per row, padded (−inf) columns; and the same bits
// on every run (the sums are added in an order fixed by the row count, without atomics).
// tags = ["gpu"].
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "nn/loss.h"
#include "runtime/dtype.h"
#include "runtime/random.h"
#include "runtime/tensor.h"
#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#include "runtime/cuda/precision_kernels.h"

namespace cohort::nn {
namespace {

using runtime::DType;
using runtime::Shape;
using runtime::Tensor;
using runtime::cuda::GpuContext;

struct Dims {
  int64_t rows, cols;
};

// Warp rows (cols ≤ 1024) and block rows, packed (cols % 8 == 0) and not, one column, one row.
const Dims kDims[] = {{1, 1}, {3, 7}, {33, 37}, {16, 64}, {9, 1000}, {4, 1030}, {5, 1032}, {3, 3001}, {2, 4096}};

// Logits exactly representable in bf16, so the CPU's fp32 reference holds the values bf16 logits do.
Tensor logitsFor(const Dims& d, uint64_t seed) {
  runtime::Rng rng(seed);
  Tensor t = Tensor::zeros(Shape{d.rows, d.cols});
  for (int64_t i = 0; i < t.numel(); ++i) t.at(i) = runtime::roundToBf16(rng.uniform(-6.0f, 6.0f));
  return t;
}

// Class indices; every other row's target is its argmax, so the correct count is not trivially 0.
Tensor targetsFor(const Tensor& logits, uint64_t seed) {
  const int64_t rows = logits.dim(0), cols = logits.dim(1);
  runtime::Rng rng(seed);
  Tensor t = Tensor::zeros(Shape{rows});
  for (int64_t r = 0; r < rows; ++r) {
    int64_t best = 0;
    for (int64_t c = 1; c < cols; ++c) best = logits.at(r * cols + c) > logits.at(r * cols + best) ? c : best;
    t.at(r) = static_cast<float>(r % 2 == 0 ? best : static_cast<int64_t>(rng.below(static_cast<uint64_t>(cols))));
  }
  return t;
}

// `host` on the device, in `type`.
Tensor onDevice(const Tensor& host, DType type, GpuContext& gpu) {
  Tensor fp32 = host.clone(gpu.allocator());
  if (type == DType::kF32) return fp32;
  Tensor bf16 = Tensor::empty(host.shape(), gpu.allocator(), DType::kBF16);
  runtime::cuda::convertToBf16(fp32.data(), bf16.raw(), fp32.numel(), gpu.stream());
  gpu.stream().synchronize();
  return bf16;
}

// A device tensor's values as fp32 on the host (bf16 widened exactly).
std::vector<float> hostValues(const Tensor& t, GpuContext& gpu) {
  gpu.stream().synchronize();
  const Tensor h = t.clone();
  std::vector<float> v(static_cast<size_t>(h.numel()));
  for (int64_t i = 0; i < h.numel(); ++i) {
    v[static_cast<size_t>(i)] =
        h.dtype() == DType::kF32 ? h.at(i) : runtime::toFloat(runtime::Bf16{h.data<uint16_t>()[i]});
  }
  return v;
}

struct GpuRun {
  LossSums sums;
  std::vector<float> grad;
  bool gradIsLogits = false;
};

GpuRun runOnGpu(const Tensor& hostLogits, const Tensor& hostTargets, DType logitsType, DType gradType, bool inPlace,
                GpuContext& gpu) {
  SoftmaxCrossEntropy loss;
  loss.setGradType(gradType);
  loss.setGradInPlace(inPlace);
  const Tensor logits = onDevice(hostLogits, logitsType, gpu), targets = hostTargets.clone(gpu.allocator());
  loss.forwardGpu(logits, targets, gpu);
  GpuRun run;
  run.sums = loss.takeGpuSums(gpu);
  run.grad = hostValues(loss.backward(), gpu);
  run.gradIsLogits = loss.backward().raw() == logits.raw();
  return run;
}

class GpuLossTest : public ::testing::Test {
 protected:
  void SetUp() override {
    COHORT_SKIP_WITHOUT_CUDA_DEVICE();
    gpu_ = std::make_unique<GpuContext>(runtime::Device::cuda(0));
  }
  std::unique_ptr<GpuContext> gpu_;
};

// Against the CPU's loss on the same (bf16-exact) logits: the loss to float rounding, the correct
// count exactly, the gradient to a few ulps (bf16: to its rounding).
TEST_F(GpuLossTest, CrossEntropyMatchesTheCpuInEveryTypeAndPlace) {
  uint64_t seed = 1;
  for (const Dims& d : kDims) {
    const Tensor logits = logitsFor(d, seed++), targets = targetsFor(logits, seed++);
    SoftmaxCrossEntropy cpu;
    const double wantLoss = cpu.forward(logits, targets) * static_cast<double>(d.rows);
    const Tensor& wantGrad = cpu.backward();
    for (DType type : {DType::kF32, DType::kBF16}) {
      for (bool inPlace : {false, true}) {
        const std::string what = std::to_string(d.rows) + "x" + std::to_string(d.cols) + " " +
                                 runtime::dtypeName(type) + (inPlace ? " in place" : " apart");
        const GpuRun got = runOnGpu(logits, targets, type, type, inPlace, *gpu_);
        EXPECT_EQ(got.gradIsLogits, inPlace) << what;
        EXPECT_NEAR(got.sums.loss, wantLoss, 1e-5 * std::abs(wantLoss) + 1e-5 * static_cast<double>(d.rows)) << what;
        EXPECT_EQ(got.sums.correct, cpu.correct()) << what;
        const double rel = type == DType::kBF16 ? 1.0 / 256 : 3e-5;
        size_t wrong = 0;
        for (size_t i = 0; i < got.grad.size(); ++i) {
          const double want = wantGrad.at(static_cast<int64_t>(i));
          wrong += std::abs(got.grad[i] - want) > rel * std::abs(want) + 1e-7 / static_cast<double>(d.rows);
        }
        EXPECT_EQ(wrong, 0u) << what << ": gradient elements off the CPU's";
      }
    }
  }
}

// In place or apart, and from bf16 logits or their fp32 widening: the same bits (the packs are 8
// columns whatever the type, so the lanes split a row alike), and the same again on a second run.
TEST_F(GpuLossTest, CrossEntropyGivesTheSameBitsEveryWay) {
  uint64_t seed = 100;
  for (const Dims& d : kDims) {
    const Tensor logits = logitsFor(d, seed++), targets = targetsFor(logits, seed++);
    const std::string what = std::to_string(d.rows) + "x" + std::to_string(d.cols);
    const GpuRun first = runOnGpu(logits, targets, DType::kF32, DType::kF32, false, *gpu_);
    for (const GpuRun& again : {runOnGpu(logits, targets, DType::kF32, DType::kF32, false, *gpu_),
                                runOnGpu(logits, targets, DType::kF32, DType::kF32, true, *gpu_),
                                runOnGpu(logits, targets, DType::kBF16, DType::kF32, false, *gpu_)}) {
      EXPECT_EQ(std::memcmp(&again.sums.loss, &first.sums.loss, sizeof(double)), 0) << what;
      EXPECT_EQ(again.sums.correct, first.sums.correct) << what;
      EXPECT_EQ(again.grad, first.grad) << what;
    }
    const GpuRun bf16InPlace = runOnGpu(logits, targets, DType::kBF16, DType::kBF16, true, *gpu_);
    const GpuRun bf16Apart = runOnGpu(logits, targets, DType::kF32, DType::kBF16, false, *gpu_);
    EXPECT_EQ(bf16InPlace.grad, bf16Apart.grad) << what;
    EXPECT_EQ(bf16InPlace.sums.loss, first.sums.loss) << what;
  }
}

// A padded vocabulary (GptOptions::realVocab): −inf columns after the real ones give the real row's
// loss, argmax and gradient, and a gradient of exactly 0 in the padding, in place as well.
TEST_F(GpuLossTest, CrossEntropyIgnoresPaddedColumns) {
  for (const auto& [real, padded] : {Dims{13, 16}, Dims{1000, 1024}, Dims{1027, 1032}, Dims{50257, 50304}}) {
    const Dims d{3, real};
    const Tensor logits = logitsFor(d, static_cast<uint64_t>(real)), targets = targetsFor(logits, 5);
    Tensor wide = Tensor::zeros(Shape{d.rows, padded});
    for (int64_t r = 0; r < d.rows; ++r) {
      for (int64_t c = 0; c < padded; ++c) wide.at(r * padded + c) = c < real ? logits.at(r * real + c) : -INFINITY;
    }
    for (DType type : {DType::kF32, DType::kBF16}) {
      const std::string what = std::to_string(real) + " of " + std::to_string(padded) + " " + runtime::dtypeName(type);
      const GpuRun want = runOnGpu(logits, targets, type, type, false, *gpu_);
      const GpuRun got = runOnGpu(wide, targets, type, type, true, *gpu_);
      EXPECT_NEAR(got.sums.loss, want.sums.loss, 1e-6 * std::abs(want.sums.loss)) << what;
      EXPECT_EQ(got.sums.correct, want.sums.correct) << what;
      for (int64_t r = 0; r < d.rows; ++r) {
        for (int64_t c = real; c < padded; ++c) {
          ASSERT_EQ(got.grad[static_cast<size_t>(r * padded + c)], 0.0f) << what << " row " << r << " column " << c;
        }
        for (int64_t c = 0; c < real; c += 7) {
          const float w = want.grad[static_cast<size_t>(r * real + c)], g = got.grad[static_cast<size_t>(r * padded + c)];
          EXPECT_NEAR(g, w, 1e-5 * std::abs(w) + 1e-9) << what << " row " << r << " column " << c;
        }
      }
    }
  }
}

// Switching the opt-in off again gives the loss its own gradient buffer: the logits of the in-place
// call are not written by the next one.
TEST_F(GpuLossTest, CrossEntropyInPlaceCanBeTurnedOff) {
  const Dims d{4, 40};
  const Tensor logits = logitsFor(d, 7), targets = targetsFor(logits, 8).clone(gpu_->allocator());
  const Tensor first = logits.clone(gpu_->allocator()), second = logits.clone(gpu_->allocator());
  SoftmaxCrossEntropy loss;
  loss.setGradInPlace(true);
  loss.forwardGpu(first, targets, *gpu_);
  const std::vector<float> firstGrad = hostValues(first, *gpu_);
  loss.setGradInPlace(false);
  loss.forwardGpu(second, targets, *gpu_);
  EXPECT_NE(loss.backward().raw(), first.raw());
  EXPECT_EQ(hostValues(first, *gpu_), firstGrad);
  EXPECT_EQ(hostValues(second, *gpu_), hostValues(logits.clone(gpu_->allocator()), *gpu_));
  EXPECT_EQ(hostValues(loss.backward(), *gpu_), firstGrad);
}

}  // namespace
}  // namespace cohort::nn

#else
TEST(GpuLossTest, NeedsCuda) { GTEST_SKIP() << "no CUDA device: CUDA support not compiled in"; }
#endif
