// Every function of runtime/cuda/kernels.h against the CPU code it must match (tags = ["gpu"]):
// cpu::gemm for Blas, and nn's Activation, Softmax, Dropout, SoftmaxCrossEntropy, MeanSquaredError
// and Adam optimizer, each run on CPU tensors with the same inputs the GPU gets.
//
// Inputs are pseudo-random, so reduction order and FMA contraction differ between the two sides:
// results must agree within |got − want| <= atol + rtol·|want|, with rtol at a few float32 ulps for
// elementwise results and atol scaled to the inputs where sums can cancel. Masks, counts and
// single-rounding results (dropout, multiply, the MSE gradient) must agree exactly.
// Shapes cover empty inputs (null pointers: nothing may be touched), one row, widths that are not
// multiples of 4 or 32, rows wider than a warp's share (the block-per-row path), and aligned and
// misaligned buffers (the float4 and the scalar paths).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include <cuda_runtime.h>

#include "nn/activation.h"
#include "nn/dropout.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/optimizer.h"
#include "nn/softmax.h"
#include "runtime/cpu/blas.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels.h"
#include "runtime/dropout_mask.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/random.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace cohort::runtime::cuda {
namespace {

using std::chrono::milliseconds;
using Floats = std::vector<float>;

constexpr milliseconds kSyncTimeout{30000};
const size_t kSizes[] = {0, 1, 3, 4, 5, 33, 1000, 4097, (size_t{1} << 20) + 3};

Floats randomFloats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed);
  Floats v(n);
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}

float maxAbs(const Floats& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

struct Tolerance {
  double rtol = 0.0;
  double atol = 0.0;
};

// Counts the mismatches and reports the first and the worst, instead of one failure per element.
void expectClose(const Floats& got, const Floats& want, Tolerance tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t wrong = 0, first = 0, worst = 0;
  double worstExcess = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))) continue;
    double err = std::abs(static_cast<double>(got[i]) - want[i]);
    double allowed = tol.atol + tol.rtol * std::abs(static_cast<double>(want[i]));
    if (err <= allowed) continue;
    if (wrong++ == 0) first = i;
    if (err - allowed >= worstExcess) worstExcess = err - allowed, worst = i;
  }
  EXPECT_EQ(wrong, 0u) << what << ": first mismatch at " << first << ": got " << got[first] << ", want " << want[first]
                       << "; worst at " << worst << ": got " << got[worst] << ", want " << want[worst] << " (rtol "
                       << tol.rtol << ", atol " << tol.atol << ")";
}

// `count` floats of device memory, `offset` floats into a cudaMalloc block: offset 1 is misaligned
// for float4, so the kernels take their scalar path. Empty arrays have a null data().
class DeviceArray {
 public:
  DeviceArray(size_t count, size_t offset) : count_(count) {
    if (count == 0) return;
    COHORT_CUDA_CHECK(cudaMalloc(&base_, (count + offset) * sizeof(float)));
    data_ = static_cast<float*>(base_) + offset;
  }
  ~DeviceArray() {
    if (base_) cudaFree(base_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  float* data() const { return data_; }
  size_t size() const { return count_; }

 private:
  size_t count_ = 0;
  void* base_ = nullptr;
  float* data_ = nullptr;
};

// loss, correct, badTargets: the three device scalars softmaxCrossEntropy adds to.
struct CeSums {
  float loss, correct, bad;
};

class KernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    COHORT_SKIP_WITHOUT_CUDA_DEVICE();
    stream_ = std::make_unique<Stream>(Device::cuda(0), StreamOptions{.name = "kernels"});
  }
  const Stream& stream() const { return *stream_; }

  // A device copy of `values` (on the test stream, which the kernels use too, then waited for).
  std::unique_ptr<DeviceArray> upload(const Floats& values, size_t offset = 0) {
    auto array = std::make_unique<DeviceArray>(values.size(), offset);
    if (!values.empty()) {
      COHORT_CUDA_CHECK(cudaMemcpyAsync(array->data(), values.data(), values.size() * sizeof(float),
                                        cudaMemcpyHostToDevice, native()));
    }
    stream().synchronize(kSyncTimeout);
    return array;
  }
  // Waits for the stream, then copies the array back.
  Floats download(const DeviceArray& array) {
    Floats values(array.size());
    if (!values.empty()) {
      COHORT_CUDA_CHECK(cudaMemcpyAsync(values.data(), array.data(), values.size() * sizeof(float),
                                        cudaMemcpyDeviceToHost, native()));
    }
    stream().synchronize(kSyncTimeout);
    return values;
  }
  cudaStream_t native() const { return static_cast<cudaStream_t>(stream().native()); }

  // Runs the GPU cross-entropy `times` times on fresh zeroed scalars; returns the sums and sets `grad`.
  CeSums crossEntropy(const Floats& logits, const Floats& targets, int64_t rows, int64_t cols, Floats& grad,
                      int times = 1) {
    auto dlogits = upload(logits), dtargets = upload(targets);
    auto dgrad = upload(Floats(logits.size(), 7.0f)), dsums = upload({0.0f, 0.0f, 0.0f});
    auto dscratch = upload(Floats(static_cast<size_t>(crossEntropyScratchFloats(rows))));
    float* s = dsums->data();
    for (int i = 0; i < times; ++i) {
      softmaxCrossEntropy({.logits = dlogits->data(), .targets = dtargets->data(), .grad = dgrad->data(), .sums = s,
                           .scratch = dscratch->data()},
                          rows, cols, stream());
    }
    grad = download(*dgrad);
    Floats sums = download(*dsums);
    return {sums[0], sums[1], sums[2]};
  }

  std::unique_ptr<Stream> stream_;
};

// ---- Blas ----

TEST_F(KernelsTest, GemmMatchesCpuGemmForEveryTranspose) {
  struct Dims {
    int m, n, k;
  };
  const Dims kDims[] = {{1, 1, 1},      {3, 5, 7}, {1, 10, 784}, {33, 17, 65},
                        {128, 96, 257}, {5, 6, 0}, {0, 4, 3},    {4, 0, 3}};
  Blas blas(stream());
  uint64_t seed = 1;
  for (const Dims& d : kDims) {
    for (int trans = 0; trans < 4; ++trans) {
      for (float beta : {0.0f, 1.0f, 0.5f}) {
        GemmOptions o{.m = d.m,
                      .n = d.n,
                      .k = d.k,
                      .transA = (trans & 1) != 0,
                      .transB = (trans & 2) != 0,
                      .alpha = beta == 0.0f ? 1.0f : 0.75f,
                      .beta = beta};
        std::string what = "gemm " + std::to_string(d.m) + "x" + std::to_string(d.n) + "x" + std::to_string(d.k) +
                           (o.transA ? " A^T" : " A") + (o.transB ? " B^T" : " B") + " beta " + std::to_string(beta);
        Floats a = randomFloats(static_cast<size_t>(d.m) * d.k, seed++);
        Floats b = randomFloats(static_cast<size_t>(d.k) * d.n, seed++);
        Floats c = randomFloats(static_cast<size_t>(d.m) * d.n, seed++);
        auto da = upload(a), db = upload(b), dc = upload(c);
        blas.gemm(o, da->data(), db->data(), dc->data());
        Floats want = c;
        if (d.k == 0) {  // C = beta·C; OpenBLAS rejects a leading dimension of 0, so no reference call
          for (float& x : want) x *= beta;
        } else {
          cpu::gemm(o, a.data(), b.data(), want.data());
        }
        expectClose(download(*dc), want, {1e-5, 1e-6 * (d.k + 1)}, what);
      }
    }
  }
}

// Strided batches (attention's per-head products) against cpu::gemmBatched: every transpose, gaps
// between the matrices, a broadcast B (stride 0), beta, an empty k, and bad batches refused.
TEST_F(KernelsTest, GemmBatchedMatchesCpuGemmBatched) {
  Blas blas(stream());
  uint64_t seed = 100;
  for (int k : {9, 0}) {
    for (int trans = 0; trans < 4; ++trans) {
      for (int64_t strideB : {int64_t{0}, int64_t{9 * 5 + 2}}) {
        const GemmOptions o{
            .m = 6, .n = 5, .k = k, .transA = (trans & 1) != 0, .transB = (trans & 2) != 0, .alpha = 0.75f, .beta = 0.5f};
        const GemmBatch batch{.count = 3, .strideA = 6 * 9 + 1, .strideB = strideB, .strideC = 6 * 5 + 3};
        std::string what = "batch k " + std::to_string(k) + (o.transA ? " A^T" : " A") + (o.transB ? " B^T" : " B") +
                           " strideB " + std::to_string(strideB);
        Floats a = randomFloats(3 * (6 * 9 + 1), seed++), b = randomFloats(3 * (9 * 5 + 2), seed++);
        Floats c = randomFloats(3 * (6 * 5 + 3), seed++);
        auto da = upload(a), db = upload(b), dc = upload(c);
        blas.gemmBatched(o, batch, da->data(), db->data(), dc->data());
        Floats want = c;
        cpu::gemmBatched(o, batch, a.data(), b.data(), want.data());
        expectClose(download(*dc), want, {1e-5, 1e-6 * (k + 1)}, what);
      }
    }
  }
  auto dc = upload(Floats(8, 0.0f));
  EXPECT_THROW(blas.gemmBatched({.m = 2, .n = 2, .k = 1}, {.count = 2, .strideC = 3}, dc->data(), dc->data(),
                                dc->data()),
               InvalidArgument);  // overlapping C matrices
}

// ---- activations ----

nn::ActivationKind kindOf(ActivationOp op) {
  switch (op) {
    case ActivationOp::kRelu:
      return nn::ActivationKind::kRelu;
    case ActivationOp::kTanh:
      return nn::ActivationKind::kTanh;
    default:
      return nn::ActivationKind::kSigmoid;
  }
}

const ActivationOp kOps[] = {ActivationOp::kIdentity, ActivationOp::kRelu, ActivationOp::kTanh, ActivationOp::kSigmoid};
const char* const kOpNames[] = {"identity", "relu", "tanh", "sigmoid"};
// tanhf and expf are within 2 ulps on both sides; a few ulps after the arithmetic around them.
const Tolerance kActivationTolerance{1e-5, 1e-7};

// In [-6, 6), with zeros and saturating values first.
Floats activationInputs(size_t n, uint64_t seed) {
  Floats x = randomFloats(n, seed, -6.0f, 6.0f);
  const float specials[] = {0.0f, -0.0f, 30.0f, -30.0f, 100.0f, -100.0f};
  for (size_t i = 0; i < std::min(n, std::size(specials)); ++i) x[i] = specials[i];
  return x;
}

// nn::Activation's forward, and its backward for `dy` when given (identity: x and dy themselves).
Floats cpuActivation(ActivationOp op, Floats x, const Floats* dy = nullptr) {
  if (op == ActivationOp::kIdentity || x.empty()) return dy ? *dy : x;
  nn::Activation act(kindOf(op));
  nn::Pass pass;
  const Tensor& y = act.forward(Tensor::view(x.data(), Shape{static_cast<int64_t>(x.size())}), pass);
  if (!dy) return Floats(y.data(), y.data() + y.numel());
  Floats g = *dy;
  const Tensor& dx = act.backward(Tensor::view(g.data(), Shape{static_cast<int64_t>(g.size())}), pass);
  return Floats(dx.data(), dx.data() + dx.numel());
}

TEST_F(KernelsTest, ActivationForwardAndBackwardMatchNn) {
  for (int k = 0; k < 4; ++k) {
    ActivationOp op = kOps[k];
    for (size_t n : kSizes) {
      for (size_t offset : {0, 1}) {
        std::string what = std::string(kOpNames[k]) + " n=" + std::to_string(n) + " offset=" + std::to_string(offset);
        Floats x = activationInputs(n, n + 7), dy = randomFloats(n, n + 8);
        Floats y = cpuActivation(op, x);
        auto dx = upload(x, offset), out = upload(Floats(n, -7.0f), offset);
        activationForward(op, dx->data(), out->data(), static_cast<int64_t>(n), stream());
        expectClose(download(*out), y, kActivationTolerance, what + " forward");
        activationForward(op, dx->data(), dx->data(), static_cast<int64_t>(n), stream());
        expectClose(download(*dx), y, kActivationTolerance, what + " forward in place");

        // The backward gets the CPU's y, so it is compared on identical inputs.
        auto dY = upload(y, offset), dDy = upload(dy, offset), dDx = upload(Floats(n, -7.0f), offset);
        activationBackward(op, dY->data(), dDy->data(), dDx->data(), static_cast<int64_t>(n), stream());
        expectClose(download(*dDx), cpuActivation(op, x, &dy), kActivationTolerance, what + " backward");
      }
    }
  }
}

TEST_F(KernelsTest, BiasActivationMatchesLinearBiasThenActivation) {
  struct Dims {
    int64_t rows, cols;
  };
  const Dims kDims[] = {{0, 5}, {3, 0}, {1, 1}, {1, 7}, {3, 4}, {5, 33}, {64, 512}, {17, 1000}, {300, 3}};
  for (int k = 0; k < 4; ++k) {
    for (const Dims& d : kDims) {
      for (size_t offset : {0, 1}) {
        for (bool withBias : {true, false}) {
          std::string what = std::string(kOpNames[k]) + " " + std::to_string(d.rows) + "x" + std::to_string(d.cols) +
                             " offset=" + std::to_string(offset) + (withBias ? "" : " no bias");
          size_t n = static_cast<size_t>(d.rows * d.cols);
          Floats y = activationInputs(n, n + 1), bias = randomFloats(static_cast<size_t>(d.cols), n + 2);
          auto dy = upload(y, offset), dbias = upload(bias, offset);
          biasActivation(kOps[k], dy->data(), withBias ? dbias->data() : nullptr, d.rows, d.cols, stream());
          if (withBias) {  // nn/linear.cc's bias loop
            for (int64_t r = 0; r < d.rows; ++r) {
              for (int64_t c = 0; c < d.cols; ++c)
                y[static_cast<size_t>(r * d.cols + c)] += bias[static_cast<size_t>(c)];
            }
          }
          expectClose(download(*dy), cpuActivation(kOps[k], y), kActivationTolerance, what);
        }
      }
    }
  }
}

// ---- softmax ----

struct RowDims {
  int64_t rows, cols;
};
// Up to 1024 columns a warp takes a row, above it a block.
const RowDims kRowDims[] = {{0, 5}, {5, 0}, {1, 1}, {1, 10}, {4, 7}, {64, 10}, {3, 1000}, {2, 1025}, {3, 5000}};

// Logits in [-4, 4), or large ones in [1000, 1100) whose exp overflows without the max subtracted.
Floats logitsFor(size_t n, uint64_t seed, bool large) {
  return large ? randomFloats(n, seed, 1000.0f, 1100.0f) : randomFloats(n, seed, -4.0f, 4.0f);
}

TEST_F(KernelsTest, SoftmaxForwardAndBackwardMatchNn) {
  for (const RowDims& d : kRowDims) {
    for (bool log : {false, true}) {
      for (bool large : {false, true}) {
        std::string what = std::string(log ? "log-softmax " : "softmax ") + std::to_string(d.rows) + "x" +
                           std::to_string(d.cols) + (large ? " large logits" : "");
        size_t n = static_cast<size_t>(d.rows * d.cols);
        Floats x = logitsFor(n, n + 5, large), dy = randomFloats(n, n + 6);
        auto dx = upload(x), dout = upload(Floats(n, -7.0f));
        softmaxForward(dx->data(), dout->data(), d.rows, d.cols, log, stream());
        Floats gotY = download(*dout);
        if (n == 0) continue;  // nothing was written: the null buffers would have crashed

        nn::Softmax softmax(log);
        nn::Pass pass;
        const Tensor& yt = softmax.forward(Tensor::view(x.data(), Shape{d.rows, d.cols}), pass);
        Floats y(yt.data(), yt.data() + yt.numel());
        // log-softmax is x − lse: both sides round lse, so the error scales with the logits.
        Tolerance forwardTol = log ? Tolerance{1e-5, 2.5e-7 * maxAbs(x)} : Tolerance{1e-5, 1e-9};
        expectClose(gotY, y, forwardTol, what + " forward");

        auto dY = upload(y), dDy = upload(dy), dDx = upload(Floats(n, -7.0f));
        softmaxBackward(dY->data(), dDy->data(), dDx->data(), d.rows, d.cols, log, stream());
        const Tensor& dxt = softmax.backward(Tensor::view(dy.data(), Shape{d.rows, d.cols}), pass);
        // dy − p·Σdy can cancel: allow a few roundings at the size of the largest row sum of dy.
        double maxRowSum = 0.0;
        for (int64_t r = 0; r < d.rows; ++r) {
          double s = 0.0;
          for (int64_t c = 0; c < d.cols; ++c) s += dy[static_cast<size_t>(r * d.cols + c)];
          maxRowSum = std::max(maxRowSum, std::abs(s));
        }
        Tolerance backwardTol = log ? Tolerance{1e-5, 1e-6 * (1.0 + maxRowSum)} : Tolerance{1e-5, 1e-8};
        expectClose(download(*dDx), Floats(dxt.data(), dxt.data() + dxt.numel()), backwardTol, what + " backward");
      }
    }
  }
}

// ---- losses ----

TEST_F(KernelsTest, SoftmaxCrossEntropyMatchesNn) {
  const RowDims kDims[] = {{1, 1}, {1, 10}, {64, 10}, {33, 37}, {128, 1000}, {5, 3000}};
  for (const RowDims& d : kDims) {
    for (bool large : {false, true}) {
      std::string what =
          "cross-entropy " + std::to_string(d.rows) + "x" + std::to_string(d.cols) + (large ? " large logits" : "");
      size_t n = static_cast<size_t>(d.rows * d.cols);
      Floats logits = logitsFor(n, n + 9, large), targets(static_cast<size_t>(d.rows));
      Rng rng(n + 10);
      for (float& t : targets) t = static_cast<float>(rng.below(static_cast<uint64_t>(d.cols)));

      nn::SoftmaxCrossEntropy ce;
      float mean =
          ce.forward(Tensor::view(logits.data(), Shape{d.rows, d.cols}), Tensor::view(targets.data(), Shape{d.rows}));
      const Tensor& want = ce.backward();
      Floats grad;
      CeSums sums = crossEntropy(logits, targets, d.rows, d.cols, grad, 2);
      double rows = static_cast<double>(d.rows);
      // Each row's loss is log(sum) + max − logit: one rounding at the size of the logits.
      double lossAtol = 2.5e-7 * rows * (1.0 + maxAbs(logits));
      EXPECT_NEAR(sums.loss, 2.0 * mean * rows, 2e-5 * std::abs(2.0 * mean * rows) + 2 * lossAtol) << what;
      EXPECT_EQ(sums.correct, 2.0f * static_cast<float>(ce.correct())) << what;
      EXPECT_EQ(sums.bad, 0.0f) << what;
      // The CPU sums the exps one by one in float: a relative error of a few 1e-6 over 3000 columns.
      expectClose(grad, Floats(want.data(), want.data() + want.numel()), {3e-5, 1e-6 / rows}, what + " gradient");
    }
  }
}

TEST_F(KernelsTest, SoftmaxCrossEntropyCountsBadTargets) {
  const int64_t rows = 8, cols = 5;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Floats targets = {1.0f, -1.0f, 2.5f, 5.0f, nan, 4.0f, 0.0f, 1e30f};
  const int64_t validRows[] = {0, 5, 6};
  Floats logits = logitsFor(rows * cols, 11, false);
  Floats grad;
  CeSums sums = crossEntropy(logits, targets, rows, cols, grad);
  EXPECT_EQ(sums.bad, 5.0f);

  // The reference is nn's loss over the valid rows alone; its gradient is divided by 3 rows, the
  // GPU's by all 8.
  Floats validLogits, validTargets;
  for (int64_t r : validRows) {
    validLogits.insert(validLogits.end(), logits.begin() + r * cols, logits.begin() + (r + 1) * cols);
    validTargets.push_back(targets[static_cast<size_t>(r)]);
  }
  nn::SoftmaxCrossEntropy ce;
  float mean =
      ce.forward(Tensor::view(validLogits.data(), Shape{3, cols}), Tensor::view(validTargets.data(), Shape{3}));
  EXPECT_NEAR(sums.loss, 3.0 * mean, 1e-5 * 3.0 * mean + 1e-6);
  EXPECT_EQ(sums.correct, static_cast<float>(ce.correct()));
  Floats want(static_cast<size_t>(rows * cols), 0.0f);
  for (size_t i = 0; i < 3; ++i) {
    for (int64_t c = 0; c < cols; ++c) {
      want[static_cast<size_t>(validRows[i] * cols + c)] = ce.backward().data()[i * cols + c] * 3.0f / 8.0f;
    }
  }
  expectClose(grad, want, {1e-5, 1e-7}, "gradient (bad rows must be 0)");
  for (int64_t r : {1, 2, 3, 4, 7}) {
    for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(grad[static_cast<size_t>(r * cols + c)], 0.0f) << "row " << r;
  }
}

TEST_F(KernelsTest, MeanSquaredErrorMatchesNn) {
  for (size_t n : kSizes) {
    for (size_t offset : {0, 1}) {
      std::string what = "mse n=" + std::to_string(n) + " offset=" + std::to_string(offset);
      Floats out = randomFloats(n, n + 12), targets = randomFloats(n, n + 13);
      auto dout = upload(out, offset), dtargets = upload(targets, offset), dgrad = upload(Floats(n, 7.0f), offset);
      auto dloss = upload({0.0f}), dscratch = upload(Floats(2 * kMseScratchDoubles));
      // lossScale 3/n: three times the mean, as for a batch of 3 samples.
      const float lossScale = n ? 3.0f / static_cast<float>(n) : 0.0f;
      meanSquaredError({.out = dout->data(), .targets = dtargets->data(), .grad = dgrad->data(), .lossSum = dloss->data(),
                        .scratch = reinterpret_cast<double*>(dscratch->data())},
                       static_cast<int64_t>(n), lossScale, stream());
      Floats grad = download(*dgrad);
      float loss = download(*dloss)[0];
      nn::MeanSquaredError mse;
      Shape shape{static_cast<int64_t>(n)};
      float want = mse.forward(Tensor::view(out.data(), shape), Tensor::view(targets.data(), shape));
      EXPECT_NEAR(loss, 3.0 * want, 3e-5 * want) << what;
      // 2/n · (out − target): the same two roundings on both sides.
      expectClose(grad, Floats(mse.backward().data(), mse.backward().data() + n), {}, what + " gradient");
    }
  }
}

// ---- dropout ----

// nn::Dropout seeds each mask with one draw from the pass's Rng; the GPU gets the same seed.
TEST_F(KernelsTest, DropoutDrawsTheCpuMaskAndMultiplyAppliesIt) {
  const uint64_t rngSeed = 0x9E3779B97F4A7C15ull;
  for (size_t n : kSizes) {
    for (size_t offset : {0, 1}) {
      for (float p : {0.0f, 0.1f, 0.5f, 0.9f}) {
        std::string what =
            "dropout n=" + std::to_string(n) + " offset=" + std::to_string(offset) + " p=" + std::to_string(p);
        Floats x = randomFloats(n, n + 14), dy = randomFloats(n, n + 15);
        const uint64_t seed = Rng(rngSeed).nextU64();
        auto dx = upload(x, offset), dout = upload(Floats(n, 7.0f), offset), dmask = upload(Floats(n, 7.0f), offset);
        dropoutForward(dx->data(), dout->data(), dmask->data(), static_cast<int64_t>(n), p, seed, stream());
        auto ddy = upload(dy, offset), ddx = upload(Floats(n, 7.0f), offset);
        multiply(ddy->data(), dmask->data(), ddx->data(), static_cast<int64_t>(n), stream());

        // The mask nn::Dropout keeps (it is private, so drawn here the same way), then the module.
        const float scale = 1.0f / (1.0f - p);
        Floats mask(n);
        size_t kept = 0;
        for (size_t i = 0; i < n; ++i) {
          mask[i] = dropoutKeep(seed, i, p) ? scale : 0.0f;
          kept += mask[i] != 0.0f;
        }
        expectClose(download(*dmask), mask, {}, what + " mask");
        if (n > 100000) {
          EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(n), 1.0 - p, 0.01) << what << " keep rate";
        }
        if (n == 0) continue;
        Rng rng(rngSeed);
        nn::Pass pass;
        pass.rng = &rng;
        nn::Dropout dropout(p);  // p = 0 is the identity there, and a mask of ones here
        Shape shape{static_cast<int64_t>(n)};
        const Tensor& y = dropout.forward(Tensor::view(x.data(), shape), pass);
        expectClose(download(*dout), Floats(y.data(), y.data() + n), {}, what + " output");
        const Tensor& dxWant = dropout.backward(Tensor::view(dy.data(), shape), pass);
        expectClose(download(*ddx), Floats(dxWant.data(), dxWant.data() + n), {}, what + " multiply");
      }
    }
  }
}

// ---- Adam ----

TEST_F(KernelsTest, AdamStepMatchesNnOptimizer) {
  const size_t kAdamSizes[] = {0, 1, 5, 4097, (size_t{1} << 20) + 3};
  for (nn::OptimizerKind kind : {nn::OptimizerKind::kAdam, nn::OptimizerKind::kAdamW}) {
    for (float wd : {0.0f, 0.01f}) {
      for (size_t n : kAdamSizes) {
        for (size_t offset : {0, 1}) {
          bool decoupled = kind == nn::OptimizerKind::kAdamW;
          std::string what = std::string(decoupled ? "adamw" : "adam") + " wd=" + std::to_string(wd) +
                             " n=" + std::to_string(n) + " offset=" + std::to_string(offset);
          nn::OptimizerOptions o{.kind = kind, .lr = 1e-3f, .weightDecay = wd};
          std::unique_ptr<nn::Optimizer> cpuAdam = nn::makeOptimizer(o, n);
          Floats params = randomFloats(n, n + 16);
          auto dparams = upload(params, offset), dm = upload(Floats(n, 0.0f), offset),
               dv = upload(Floats(n, 0.0f), offset);
          Shape shape{static_cast<int64_t>(n)};
          Floats grads;
          for (int step = 0; step < 3; ++step) {
            grads = randomFloats(n, n + 17 + static_cast<size_t>(step));
            cpuAdam->step(Tensor::view(params.data(), shape), Tensor::view(grads.data(), shape));
            auto dgrads = upload(grads, offset);
            // The bias corrections as nn/optimizer.cc's beginStep computes them.
            const double t = step + 1;
            AdamStepOptions a{
                .beta1 = o.beta1,
                .beta2 = o.beta2,
                .eps = o.eps,
                .decay = decoupled ? 1.0f - o.lr * wd : 1.0f,
                .coupledWeightDecay = decoupled ? 0.0f : wd,
                .stepSize = static_cast<float>(o.lr / (1.0 - std::pow(static_cast<double>(o.beta1), t))),
                .bc2Sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(o.beta2), t)))};
            adamStep(dparams->data(), dgrads->data(), dm->data(), dv->data(), static_cast<int64_t>(n), a, stream());
            stream().synchronize(kSyncTimeout);  // before dgrads is freed
          }
          std::vector<nn::Optimizer::StateTensor> state = cpuAdam->state();
          ASSERT_EQ(state.size(), 2u);
          Floats m(state[0].tensor.data(), state[0].tensor.data() + n);
          Floats v(state[1].tensor.data(), state[1].tensor.data() + n);
          // m = β1·m + (1−β1)·g can cancel: allow rounding at the gradients' size.
          expectClose(download(*dm), m, {1e-5, 1e-7}, what + " exp_avg");
          expectClose(download(*dv), v, {1e-5, 0.0}, what + " exp_avg_sq");
          expectClose(download(*dparams), params, {1e-6, 1e-8}, what + " params");
        }
      }
    }
  }
}

// ---- empty inputs ----

TEST_F(KernelsTest, EmptyInputsEnqueueNothing) {
  // Null pointers everywhere: any kernel that ran would fault.
  Blas blas(stream());
  blas.gemm({.m = 0, .n = 4, .k = 3}, nullptr, nullptr, nullptr);
  blas.gemm({.m = 4, .n = 0, .k = 3}, nullptr, nullptr, nullptr);
  for (ActivationOp op : kOps) {
    biasActivation(op, nullptr, nullptr, 0, 7, stream());
    biasActivation(op, nullptr, nullptr, 7, 0, stream());
    activationForward(op, nullptr, nullptr, 0, stream());
    activationBackward(op, nullptr, nullptr, nullptr, 0, stream());
  }
  softmaxForward(nullptr, nullptr, 0, 10, false, stream());
  softmaxBackward(nullptr, nullptr, nullptr, 3, 0, true, stream());
  dropoutForward(nullptr, nullptr, nullptr, 0, 0.5f, 1, stream());
  multiply(nullptr, nullptr, nullptr, 0, stream());
  softmaxCrossEntropy({}, 0, 10, stream());
  meanSquaredError({}, 0, 1.0f, stream());
  adamStep(nullptr, nullptr, nullptr, nullptr, 0, {}, stream());
  stream().synchronize(kSyncTimeout);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace cohort::runtime::cuda

#else  // !COHORT_HAVE_CUDA

TEST(KernelsTest, NeedsCuda) { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }

#endif
