// runtime/cuda/reduce_kernels.h's channelSum against a double-precision CPU sum (tags = ["gpu"]).
//
// Two kinds of input. Small integers (|x| <= 8) make every partial sum exact in float, so the GPU
// must equal the CPU exactly whatever its order: a wrong index, a skipped or doubled element fails.
// Uniform values in ±1 check the rounding bound the header states: |got − exact| <=
// (terms + 1)·2⁻²⁴·(Σ|x| + |old|) (terms = outer·inner additions per channel, + 1 for accumulate).
// Every case runs twice with different garbage in the scratch and the output (when overwriting) and
// must give the same bits. Shapes: no rows, one row, rows not a multiple of the 128-row chunk,
// several chunks, more chunks than a warp has lanes (stage 2), one channel, channels not a multiple
// of the 32-channel tile; for NCHW inner sizes below and above the 256-thread block and several
// 4096-element chunks. Kept small for the emulator.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/reduce_kernels.h"
#include "runtime/random.h"
#include "runtime/stream.h"

namespace cohort::runtime::cuda {
namespace {

using Floats = std::vector<float>;
constexpr std::chrono::milliseconds kSyncTimeout{30000};

struct Case {
  int64_t outer, channels, inner;
};

const Case kCases[] = {
    // Linear: x[rows, cols]
    {0, 5, 1}, {1, 1, 1}, {1, 40, 1}, {127, 1, 1}, {129, 33, 1}, {300, 70, 1}, {1000, 3, 1},
    {5000, 3, 1},  // 40 chunks: more than stage 2's 32 lanes
    // NCHW: x[N, C, H·W]
    {0, 4, 9}, {1, 1, 2}, {3, 5, 7}, {2, 33, 49}, {700, 2, 7}, {9, 3, 1000}, {2, 1, 5000},
    {40, 2, 4100},  // 41 chunks
};

std::string describe(const Case& c, bool accumulate) {
  std::string s = "[";
  s += std::to_string(c.outer) + ", " + std::to_string(c.channels) + ", " + std::to_string(c.inner) + "]";
  if (accumulate) s += " accumulate";
  return s;
}

class ReduceKernelsTest : public ::testing::Test {
 public:
  void SetUp() override {
    COHORT_SKIP_WITHOUT_CUDA_DEVICE();
    stream_ = std::make_unique<Stream>(Device::cuda(0), StreamOptions{.name = "reduce"});
  }

  // sums after channelSum on a fresh device copy of x, old and a scratch full of `garbage`.
  Floats run(const Floats& x, const Floats& old, const ChannelSumOptions& o, float garbage) {
    const int64_t scratchFloats = channelSumScratchFloats(o);
    float* dx = upload(x);
    float* dsums = upload(old);
    float* dscratch = upload(Floats(static_cast<size_t>(scratchFloats), garbage));
    channelSum({.x = dx, .sums = dsums, .scratch = dscratch}, o, *stream_);
    Floats got(old.size());
    if (!got.empty()) {
      COHORT_CUDA_CHECK(cudaMemcpyAsync(got.data(), dsums, got.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                        static_cast<cudaStream_t>(stream_->native())));
    }
    stream_->synchronize(kSyncTimeout);
    for (float* p : {dx, dsums, dscratch}) cudaFree(p);
    return got;
  }

  float* upload(const Floats& v) {
    if (v.empty()) return nullptr;
    float* p = nullptr;
    COHORT_CUDA_CHECK(cudaMalloc(&p, v.size() * sizeof(float)));
    // On the test's stream, then waited for: a plain cudaMemcpy from pageable memory may return
    // before its copy lands, unordered with a non-blocking stream (the first H200 run caught it).
    COHORT_CUDA_CHECK(cudaMemcpyAsync(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice,
                                      static_cast<cudaStream_t>(stream_->native())));
    stream_->synchronize(kSyncTimeout);
    return p;
  }

  std::unique_ptr<Stream> stream_;
};

// Σ in double per channel; `magnitude` gets Σ|x| per channel.
std::vector<double> cpuSums(const Floats& x, const Case& c, std::vector<double>& magnitude) {
  std::vector<double> sums(static_cast<size_t>(c.channels), 0.0);
  magnitude.assign(sums.size(), 0.0);
  for (int64_t o = 0; o < c.outer; ++o) {
    for (int64_t ch = 0; ch < c.channels; ++ch) {
      for (int64_t i = 0; i < c.inner; ++i) {
        const double v = x[static_cast<size_t>((o * c.channels + ch) * c.inner + i)];
        sums[static_cast<size_t>(ch)] += v;
        magnitude[static_cast<size_t>(ch)] += std::abs(v);
      }
    }
  }
  return sums;
}

void check(const Case& c, bool accumulate, bool integers, ReduceKernelsTest& test) {
  const std::string what = describe(c, accumulate) + (integers ? " integers" : " uniform");
  const size_t n = static_cast<size_t>(c.outer * c.channels * c.inner), channels = static_cast<size_t>(c.channels);
  Rng rng(n * 7 + channels + (integers ? 1 : 0));
  Floats x(n), old(channels);
  for (float& v : x) v = integers ? std::floor(rng.uniform(-8.0f, 9.0f)) : rng.uniform(-1.0f, 1.0f);
  for (float& v : old) v = accumulate ? std::floor(rng.uniform(-8.0f, 9.0f)) : 1e30f;  // garbage unless added to
  const ChannelSumOptions o{.outer = c.outer, .channels = c.channels, .inner = c.inner, .accumulate = accumulate};
  const Floats got = test.run(x, old, o, 7.5f);
  Floats oldAgain = old;
  if (!accumulate) oldAgain.assign(channels, -3e30f);
  const Floats again = test.run(x, oldAgain, o, -1e20f);
  ASSERT_EQ(got.size(), channels) << what;
  EXPECT_EQ(std::memcmp(got.data(), again.data(), channels * sizeof(float)), 0) << what << ": two runs differ";
  std::vector<double> magnitude;
  const std::vector<double> want = cpuSums(x, c, magnitude);
  const double terms = static_cast<double>(c.outer * c.inner) + 1.0;
  for (size_t ch = 0; ch < channels; ++ch) {
    const double exact = want[ch] + (accumulate ? old[ch] : 0.0);
    if (integers) {
      EXPECT_EQ(static_cast<double>(got[ch]), exact) << what << " channel " << ch;
    } else {
      const double bound = terms * std::ldexp(1.0, -24) * (magnitude[ch] + (accumulate ? std::abs(old[ch]) : 0.0));
      EXPECT_LE(std::abs(got[ch] - exact), bound) << what << " channel " << ch;
    }
  }
}

TEST_F(ReduceKernelsTest, ChannelSumsMatchTheCpuAndRepeatBitForBit) {
  for (const Case& c : kCases) {
    for (bool accumulate : {false, true}) {
      for (bool integers : {true, false}) check(c, accumulate, integers, *this);
    }
  }
}

TEST_F(ReduceKernelsTest, NothingToSumTouchesNothingOrWritesZeros) {
  // No channels: null pointers, nothing launched. No elements with accumulate: sums unchanged.
  channelSum({}, {.outer = 5, .channels = 0, .inner = 3}, *stream_);
  channelSum({}, {.outer = 0, .channels = 5, .inner = 1, .accumulate = true}, *stream_);
  EXPECT_EQ(channelSumScratchFloats({.outer = 0, .channels = 5, .inner = 1}), 0);
  EXPECT_EQ(run({}, Floats(3, 9.0f), {.outer = 0, .channels = 3, .inner = 4}, 0.0f), Floats(3, 0.0f));
  stream_->synchronize(kSyncTimeout);
}

TEST_F(ReduceKernelsTest, ScratchGrowsWithTheShapeOnly) {
  // 128 rows per chunk at least; 4096 elements per chunk at least for NCHW; never more than 1024 chunks.
  EXPECT_EQ(channelSumScratchFloats({.outer = 128, .channels = 10, .inner = 1}), 10);
  EXPECT_EQ(channelSumScratchFloats({.outer = 129, .channels = 10, .inner = 1}), 20);
  EXPECT_EQ(channelSumScratchFloats({.outer = 8192, .channels = 768, .inner = 1}), 64 * 768);
  EXPECT_EQ(channelSumScratchFloats({.outer = 256, .channels = 64, .inner = 1024}), 64 * 64);
  EXPECT_EQ(channelSumScratchFloats({.outer = int64_t{1} << 30, .channels = 2, .inner = 1}), 1024 * 2);
}

}  // namespace
}  // namespace cohort::runtime::cuda

#else

TEST(ReduceKernelsTest, NeedsCuda) { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }

#endif
