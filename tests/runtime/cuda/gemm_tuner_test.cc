// Blas's cuBLASLt algorithm choice (runtime/cuda/gemm_tuner.h): every single product runs through
// cuBLASLt with an algorithm chosen once per shape: the fastest candidate as timed (one tuning per
// shape, cached), the heuristic's first with tuning off or when no candidate runs, and the
// bias-gradient epilogue's sum equal to the fixed-order reduction. On the emulated device the
// candidates and their made-up times are cudasim/cublaslt_algorithms.h's, so the modelled fastest is
// known; on a real GPU the checks that need the model are left out (they are compiled only with
// COHORT_CUDASIM) and the others run. Data are small integers: every sum is exact in any order.
#include <gtest/gtest.h>

#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include <cublasLt.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "runtime/cuda/gemm_tuner.h"
#include "runtime/cuda/gpu_context.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/reduce_kernels.h"
#include "runtime/tensor.h"

#ifdef COHORT_CUDASIM
#include "cudasim/cublaslt_algorithms.h"
#endif

namespace cohort::runtime::cuda {
namespace {

using Floats = std::vector<float>;

Floats integers(size_t n, int seed) {
  Floats v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(seed) * 13) % 9) - 4);
  return v;
}

// Row-major C[m, n] = op(A) · op(B) (+ beta·C), in double (exact for these data).
Floats reference(const GemmOptions& o, const Floats& a, const Floats& b, const Floats& c0) {
  Floats c(static_cast<size_t>(o.m) * o.n);
  for (int i = 0; i < o.m; ++i) {
    for (int j = 0; j < o.n; ++j) {
      double s = o.beta != 0.0f ? o.beta * c0[static_cast<size_t>(i) * o.n + j] : 0.0;
      for (int l = 0; l < o.k; ++l) {
        const float x = o.transA ? a[static_cast<size_t>(l) * o.m + i] : a[static_cast<size_t>(i) * o.k + l];
        const float y = o.transB ? b[static_cast<size_t>(j) * o.k + l] : b[static_cast<size_t>(l) * o.n + j];
        s += static_cast<double>(o.alpha) * x * y;
      }
      c[static_cast<size_t>(i) * o.n + j] = static_cast<float>(s);
    }
  }
  return c;
}

// Times nothing: each candidate's time is given by its index in the heuristic's answer (or, on the
// emulated device, by the model), after running it once so that a refusal shows.
class ScriptedTimer final : public GemmTimer {
 public:
  enum class Times { kModel, kAllFail };
  explicit ScriptedTimer(Times times) : times_(times) {}
  float time(const GemmCandidate& c, const std::function<bool()>& launch) override {
    ++calls;
    if (!launch() || times_ == Times::kAllFail) return -1;
#ifdef COHORT_CUDASIM
    int32_t id = -1;
    size_t written = 0;
    EXPECT_EQ(cublasLtMatmulAlgoConfigGetAttribute(c.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &written),
              CUBLAS_STATUS_SUCCESS);
    return cudasim::lt::modelledMs(*cudasim::lt::algoById(id), {.m = c.m, .n = c.n, .k = c.k,
                                                                .elementBytes = c.elementBytes});
#else
    return static_cast<float>(c.index);  // the heuristic's order, as a real GPU would roughly agree
#endif
  }
  int calls = 0;

 private:
  Times times_;
};

class GemmTunerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    COHORT_SKIP_WITHOUT_CUDA_DEVICE();
    gpu_ = std::make_unique<GpuContext>(Device::cuda(0));
  }
  Tensor upload(const Floats& v) {
    Tensor t = Tensor::empty(Shape{static_cast<int64_t>(v.size())}, gpu_->allocator());
    copyToDevice(t.data(), v.data(), v.size() * sizeof(float), gpu_->stream());
    return t;
  }
  Floats download(const Tensor& t) {
    Floats v(static_cast<size_t>(t.numel()));
    copyToHost(v.data(), t.data(), v.size() * sizeof(float), gpu_->stream());
    gpu_->stream().synchronize();
    return v;
  }
  std::unique_ptr<Blas> blas(bool tune, std::shared_ptr<GemmTimer> timer) {
    return std::make_unique<Blas>(gpu_->stream(), BlasOptions{.allocator = &gpu_->allocator(), .tuneGemms = tune,
                                                              .timer = std::move(timer)});
  }
  std::unique_ptr<GpuContext> gpu_;
};

// m = n = 64 with a long k: on the emulated device split-K (algorithm 4, the heuristic's fifth)
// is the modelled fastest, and 128 x 128 tiles (algorithm 1) the heuristic's first.
constexpr GemmOptions kSmallLongK{.m = 64, .n = 64, .k = 4096, .transB = true};

TEST_F(GemmTunerTest, PicksTheFastestCandidateOncePerShape) {
  auto timer = std::make_shared<ScriptedTimer>(ScriptedTimer::Times::kModel);
  auto b = blas(true, timer);
  const GemmOptions o = kSmallLongK;
  const Floats a = integers(64 * 4096, 1), w = integers(64 * 4096, 2);
  Tensor da = upload(a), dw = upload(w), dc = upload(Floats(64 * 64, 0.0f));
  for (int run = 0; run < 3; ++run) {
    b->gemm(o, da.data(), dw.data(), dc.data());
    EXPECT_EQ(download(dc), reference(o, a, w, {})) << "run " << run;
  }
  const std::vector<GemmChoice> choices = b->gemmChoices();
  ASSERT_EQ(choices.size(), 1u);
  EXPECT_EQ(b->gemmTunings(), 1);
  EXPECT_TRUE(choices[0].tuned);
  EXPECT_GT(choices[0].candidates, 1);
  EXPECT_EQ(timer->calls, choices[0].candidates);  // each timed once, in the one tuning
#ifdef COHORT_CUDASIM
  EXPECT_EQ(choices[0].candidates, cudasim::lt::kAlgoCount);
  EXPECT_EQ(choices[0].algorithm, 4);
  EXPECT_EQ(choices[0].workspaceBytes, size_t{64} * 64 * 4 * sizeof(float));
#endif
  // Another shape is another tuning.
  const GemmOptions other{.m = 32, .n = 64, .k = 4096, .transB = true};
  b->gemm(other, da.data(), dw.data(), dc.data());
  EXPECT_EQ(b->gemmTunings(), 2);
}

TEST_F(GemmTunerTest, WithoutTuningOrWhenNoCandidateRunsTheHeuristicsFirst) {
  const Floats a = integers(64 * 4096, 3), w = integers(64 * 4096, 4);
  Tensor da = upload(a), dw = upload(w), dc = upload(Floats(64 * 64, 0.0f));
  auto untimed = std::make_shared<ScriptedTimer>(ScriptedTimer::Times::kModel);
  auto off = blas(false, untimed);
  off->gemm(kSmallLongK, da.data(), dw.data(), dc.data());
  EXPECT_EQ(download(dc), reference(kSmallLongK, a, w, {}));
  EXPECT_EQ(untimed->calls, 0);
  EXPECT_EQ(off->gemmTunings(), 0);
  ASSERT_EQ(off->gemmChoices().size(), 1u);
  EXPECT_EQ(off->gemmChoices()[0].candidates, 1);  // only the first is asked for
  auto failing = blas(true, std::make_shared<ScriptedTimer>(ScriptedTimer::Times::kAllFail));
  failing->gemm(kSmallLongK, da.data(), dw.data(), dc.data());
  EXPECT_EQ(download(dc), reference(kSmallLongK, a, w, {}));
  ASSERT_EQ(failing->gemmChoices().size(), 1u);
  EXPECT_EQ(failing->gemmChoices()[0].algorithm, off->gemmChoices()[0].algorithm);
#ifdef COHORT_CUDASIM
  EXPECT_EQ(off->gemmChoices()[0].algorithm, 1);
#endif
}

// The events' own timing: whichever candidate wins, it computes the product, and the choice stays.
TEST_F(GemmTunerTest, EventTimingChoosesACandidateThatComputesTheProduct) {
  auto b = blas(true, nullptr);
  const GemmOptions o{.m = 96, .n = 40, .k = 72, .transA = true, .beta = 1.0f};
  const Floats a = integers(96 * 72, 5), w = integers(72 * 40, 6), c0 = integers(96 * 40, 7);
  Tensor da = upload(a), dw = upload(w), dc = upload(c0);
  b->gemm(o, da.data(), dw.data(), dc.data());  // tuning writes scratch, never C
  EXPECT_EQ(download(dc), reference(o, a, w, c0));
  EXPECT_EQ(b->gemmTunings(), 1);
}

#ifdef COHORT_CUDASIM
// An A one float past a 16-byte boundary: the tensor-op algorithms are refused, as on a real GPU,
// and the SIMT one (the only candidate) runs it.
TEST_F(GemmTunerTest, MisalignedOperandsGetOnlyTheAlgorithmsThatReadThem) {
  auto b = blas(true, std::make_shared<ScriptedTimer>(ScriptedTimer::Times::kModel));
  const GemmOptions o{.m = 8, .n = 16, .k = 24};
  const Floats a = integers(8 * 24 + 1, 8), w = integers(24 * 16, 9);
  Tensor da = upload(a), dw = upload(w), dc = upload(Floats(8 * 16, 0.0f));
  b->gemm(o, da.data() + 1, dw.data(), dc.data());
  EXPECT_EQ(download(dc), reference(o, Floats(a.begin() + 1, a.end()), w, {}));
  ASSERT_EQ(b->gemmChoices().size(), 1u);
  EXPECT_EQ(b->gemmChoices()[0].candidates, 1);
  EXPECT_EQ(b->gemmChoices()[0].algorithm, 0);
}
#endif

// dW = dYᵀ · X with db = Σ dY over rows from the epilogue: db equals the fixed-order reduction
// (channelSum), and dW the product; with beta 1 dW accumulates and db is written, not added.
TEST_F(GemmTunerTest, BiasGradientEpilogueEqualsTheReduction) {
  auto b = blas(true, std::make_shared<ScriptedTimer>(ScriptedTimer::Times::kModel));
  const int rows = 48, out = 24, in = 40;
  const Floats dy = integers(static_cast<size_t>(rows) * out, 10), x = integers(static_cast<size_t>(rows) * in, 11);
  const Floats dw0 = integers(static_cast<size_t>(out) * in, 12);
  Tensor ddy = upload(dy), dx = upload(x), ddw = upload(dw0), ddb = upload(Floats(out, 99.0f));
  for (float beta : {0.0f, 1.0f}) {
    const GemmOptions o{.m = out, .n = in, .k = rows, .transA = true, .beta = beta};
    const Floats want = reference(o, dy, x, download(ddw));
    ASSERT_TRUE(b->gemmFused(o, GemmEpilogue::kBiasGrad, DType::kF32, ddy.data(), dx.data(), ddw.data(),
                             {.bias = ddb.data()}));
    EXPECT_EQ(download(ddw), want) << "beta " << beta;
    const ChannelSumOptions sum{.outer = rows, .channels = out};
    Tensor scratch = Tensor::empty(Shape{channelSumScratchFloats(sum)}, gpu_->allocator());
    Tensor reduced = upload(Floats(out, 0.0f));
    channelSum({.x = ddy.data(), .sums = reduced.data(), .scratch = scratch.data()}, sum, gpu_->stream());
    EXPECT_EQ(download(ddb), download(reduced)) << "beta " << beta;
  }
}

}  // namespace
}  // namespace cohort::runtime::cuda
#else
TEST(GemmTunerTest, NeedsCuda) { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }
#endif  // COHORT_HAVE_CUDA
