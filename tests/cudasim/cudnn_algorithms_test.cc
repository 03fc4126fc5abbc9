// cudasim's cuDNN algorithms (cudasim/cudnn_algorithms.h) as a caller sees them. cudnnFind*AlgorithmEx
// answers every algorithm of its kind, those that ran fastest first and the others last; its times
// are deterministic and make the GEMM family fastest for a small convolution and WINOGRAD_NONFUSED
// for a 50 -> 100 channel 3x3 layer (in all three directions); an algorithm needing more workspace
// than it is given does not run; the output is left NaN, the call returns with the stream idle, and
// its arguments are checked as a compute call's. Every algorithm that runs a convolution computes it:
// exactly on small integers, and on fractions as the reference from its operands rounded to the
// mantissa bits it keeps (all for the GEMM family, fewer for Winograd and FFT), which a single
// element shows bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "cudnn.h"
#include "tests/cudasim/cudnn_test_support.h"

namespace {

using namespace cudasim::testing;

// cnn:rosetta's second layer (tests/nn/gpu:gpu_layers_test's conv_rosetta_layer).
const ConvCase kRosetta{.n = 8, .c = 50, .h = 16, .w = 16, .k = 100, .r = 3, .s = 3, .padH = 1, .padW = 1};
// A 3x3 stride-1 convolution small enough for every algorithm to run on it quickly.
const ConvCase kSmall3x3{.n = 3, .c = 7, .h = 11, .w = 13, .k = 6, .r = 3, .s = 3, .padH = 1, .padW = 1};

// A device allocation of `bytes` (none for 0).
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) {
      EXPECT_EQ(cudaMalloc(&p_, bytes), cudaSuccess);
    }
  }
  ~DeviceBytes() { cudaFree(p_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_;
  void* p_ = nullptr;
};

// The three directions' Find answers for one convolution, as one type.
struct Answer {
  int algo;
  cudnnStatus_t status;
  float time;
  size_t memory;
};

template <class Perf>
std::vector<Answer> answers(const Perf* perf, int returned) {
  std::vector<Answer> out;
  for (int i = 0; i < returned; ++i)
    out.push_back({static_cast<int>(perf[i].algo), perf[i].status, perf[i].time, perf[i].memory});
  return out;
}

enum class Direction { kForward, kData, kFilter };
const char* name(Direction d) {
  return d == Direction::kForward ? "forward" : d == Direction::kData ? "data" : "filter";
}
int algoCount(Direction d) {
  if (d == Direction::kForward) return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  return d == Direction::kData ? int{CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT}
                               : int{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT};
}
int winogradNonfused(Direction d) {
  if (d == Direction::kForward) return CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
  return d == Direction::kData ? int{CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED}
                               : int{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED};
}
// The ids of the GEMM family, which accumulate plain fp32 products.
std::set<int> gemmFamily(Direction d) {
  if (d == Direction::kForward) {
    return {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
            CUDNN_CONVOLUTION_FWD_ALGO_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_DIRECT};
  }
  if (d == Direction::kData) return {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1};
  return {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3};
}

// One convolution's buffers: x, w, y (dy) and the gradients dx, dw, filled with small integers.
struct Buffers {
  explicit Buffers(const ConvCase& cc)
      : x(smallIntegers(cc.xCount(), 1)),
        w(smallIntegers(cc.wCount(), 2)),
        y(smallIntegers(cc.yCount(), 3)),
        dx(std::vector<float>(cc.xCount())),
        dw(std::vector<float>(cc.wCount())) {}
  DeviceFloats x, w, y, dx, dw;
};

// cudnnFind*AlgorithmEx of direction `d`, asking for every algorithm; the output is y, dx or dw.
cudnnStatus_t find(Direction d, Conv& conv, Buffers& b, void* ws, size_t wsBytes, std::vector<Answer>* out) {
  int returned = -1;
  cudnnStatus_t s;
  if (d == Direction::kForward) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    s = cudnnFindConvolutionForwardAlgorithmEx(conv.handle(), conv.x(), b.x.get(), conv.w(), b.w.get(), conv.conv(),
                                               conv.y(), b.y.get(), CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf,
                                               ws, wsBytes);
    *out = answers(perf, returned);
  } else if (d == Direction::kData) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    s = cudnnFindConvolutionBackwardDataAlgorithmEx(
        conv.handle(), conv.w(), b.w.get(), conv.y(), b.y.get(), conv.conv(), conv.x(), b.dx.get(),
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf, ws, wsBytes);
    *out = answers(perf, returned);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    s = cudnnFindConvolutionBackwardFilterAlgorithmEx(
        conv.handle(), conv.x(), b.x.get(), conv.y(), b.y.get(), conv.conv(), conv.w(), b.dw.get(),
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, perf, ws, wsBytes);
    *out = answers(perf, returned);
  }
  return s;
}

// Every algorithm once; those that ran first, by time; the others after, with time -1.
void expectOrdered(const std::vector<Answer>& got, Direction d) {
  ASSERT_EQ(static_cast<int>(got.size()), algoCount(d));
  std::set<int> ids;
  bool failedSeen = false;
  for (size_t i = 0; i < got.size(); ++i) {
    ids.insert(got[i].algo);
    if (got[i].status != CUDNN_STATUS_SUCCESS) {
      failedSeen = true;
      EXPECT_EQ(got[i].time, -1.0f) << "algorithm " << got[i].algo;
      continue;
    }
    EXPECT_FALSE(failedSeen) << "algorithm " << got[i].algo << " ran but is listed after one that did not";
    EXPECT_GT(got[i].time, 0.0f);
    if (i > 0 && got[i - 1].status == CUDNN_STATUS_SUCCESS) {
      EXPECT_LE(got[i - 1].time, got[i].time);
    }
  }
  EXPECT_EQ(static_cast<int>(ids.size()), algoCount(d));
}

TEST(CudasimCudnnAlgorithms, FindAnswersEveryAlgorithmFastestFirstAndWinogradWinsALargeLayer) {
  Conv conv(kRosetta);
  Buffers b(kRosetta);
  DeviceBytes ws(size_t{64} << 20);
  for (Direction d : {Direction::kForward, Direction::kData, Direction::kFilter}) {
    SCOPED_TRACE(name(d));
    std::vector<Answer> first, again;
    ASSERT_EQ(find(d, conv, b, ws.get(), ws.bytes(), &first), CUDNN_STATUS_SUCCESS);
    expectOrdered(first, d);
    EXPECT_EQ(first[0].algo, winogradNonfused(d));
    ASSERT_EQ(find(d, conv, b, ws.get(), ws.bytes(), &again), CUDNN_STATUS_SUCCESS);
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_EQ(again[i].algo, first[i].algo);
      EXPECT_EQ(again[i].time, first[i].time) << "the times are deterministic";
    }
  }
  // The outputs are left with arbitrary values (NaN here); the inputs are as they were.
  for (const DeviceFloats* out : {&b.y, &b.dx, &b.dw}) {
    for (float v : out->download()) ASSERT_TRUE(std::isnan(v));
  }
  EXPECT_EQ(b.x.download(), smallIntegers(kRosetta.xCount(), 1));
  EXPECT_EQ(b.w.download(), smallIntegers(kRosetta.wCount(), 2));
}

TEST(CudasimCudnnAlgorithms, SmallConvolutionsFavourTheGemmFamily) {
  const ConvCase small{.n = 2, .c = 3, .h = 5, .w = 6, .k = 4, .r = 3, .s = 3, .padH = 1, .padW = 1};
  Conv conv(small);
  Buffers b(small);
  DeviceBytes ws(size_t{1} << 20);
  for (Direction d : {Direction::kForward, Direction::kData, Direction::kFilter}) {
    SCOPED_TRACE(name(d));
    std::vector<Answer> got;
    ASSERT_EQ(find(d, conv, b, ws.get(), ws.bytes(), &got), CUDNN_STATUS_SUCCESS);
    expectOrdered(got, d);
    EXPECT_TRUE(gemmFamily(d).count(got[0].algo)) << "fastest: " << got[0].algo;
    // Winograd and FFT run this one too (3x3, stride 1), only slower.
    EXPECT_TRUE(std::any_of(got.begin(), got.end(), [&](const Answer& a) {
      return a.status == CUDNN_STATUS_SUCCESS && !gemmFamily(d).count(a.algo);
    }));
  }
}

TEST(CudasimCudnnAlgorithms, AnAlgorithmNeedingMoreWorkspaceThanGivenDoesNotRun) {
  Conv conv(kRosetta);
  Buffers b(kRosetta);
  std::vector<Answer> got;
  ASSERT_EQ(find(Direction::kForward, conv, b, nullptr, 0, &got), CUDNN_STATUS_SUCCESS);
  expectOrdered(got, Direction::kForward);
  ASSERT_EQ(got[0].status, CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(got[0].algo, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);  // the one that needs none
  EXPECT_EQ(got[0].memory, 0u);
  for (const Answer& a : got) {
    if (a.algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED) {
      EXPECT_EQ(a.status, CUDNN_STATUS_NOT_SUPPORTED);
      EXPECT_GT(a.memory, 0u) << "the memory it would have needed";
    }
    if (a.algo == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT) {
      EXPECT_EQ(a.status, CUDNN_STATUS_NOT_SUPPORTED);
    }
  }
  // Strided: no Winograd or FFT at all, whatever the workspace.
  const ConvCase strided{
      .n = 3, .c = 2, .h = 11, .w = 10, .k = 4, .r = 3, .s = 2, .padH = 0, .padW = 0, .strideH = 2, .strideW = 2};
  Conv conv2(strided);
  Buffers b2(strided);
  DeviceBytes ws(size_t{1} << 20);
  ASSERT_EQ(find(Direction::kFilter, conv2, b2, ws.get(), ws.bytes(), &got), CUDNN_STATUS_SUCCESS);
  for (const Answer& a : got) {
    EXPECT_EQ(a.status == CUDNN_STATUS_SUCCESS, gemmFamily(Direction::kFilter).count(a.algo) > 0) << a.algo;
  }
}

TEST(CudasimCudnnAlgorithms, FindChecksItsArgumentsAndWaitsForItsStream) {
  Conv conv(kSmall3x3);
  Buffers b(kSmall3x3);
  DeviceBytes ws(size_t{1} << 20);
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int returned = 0;
  auto forward = [&](const void* x, void* y, int requested, int* count, void* workspace, size_t bytes) {
    return cudnnFindConvolutionForwardAlgorithmEx(conv.handle(), conv.x(), x, conv.w(), b.w.get(), conv.conv(),
                                                  conv.y(), y, requested, count, perf, workspace, bytes);
  };
  EXPECT_EQ(forward(b.x.get(), b.y.get(), 0, &returned, ws.get(), ws.bytes()), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(forward(b.x.get(), b.y.get(), 1, nullptr, ws.get(), ws.bytes()), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(forward(b.x.get(), b.x.get(), 1, &returned, ws.get(), ws.bytes()), CUDNN_STATUS_BAD_PARAM)
      << "output over an input";
  std::vector<float> host(kSmall3x3.xCount());
  EXPECT_EQ(forward(host.data(), b.y.get(), 1, &returned, ws.get(), ws.bytes()), CUDNN_STATUS_BAD_PARAM)
      << "host memory";
  EXPECT_EQ(forward(b.x.get(), b.y.get(), 1, &returned, b.y.get(), kSmall3x3.yCount() * sizeof(float)),
            CUDNN_STATUS_BAD_PARAM)
      << "workspace over the output";
  // Fewer asked for, fewer given: the fastest.
  ASSERT_EQ(forward(b.x.get(), b.y.get(), 1, &returned, ws.get(), ws.bytes()), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(returned, 1);
  EXPECT_EQ(perf[0].status, CUDNN_STATUS_SUCCESS);
  // On the handle's stream, after what was enqueued there, and done when the call returns.
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudnnSetStream(conv.handle(), stream), CUDNN_STATUS_SUCCESS);
  const std::vector<float> ones(kSmall3x3.yCount(), 1.0f);
  ASSERT_EQ(cudaMemcpyAsync(b.y.get(), ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  ASSERT_EQ(forward(b.x.get(), b.y.get(), 1, &returned, ws.get(), ws.bytes()), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudaStreamQuery(stream), cudaSuccess);
  for (float v : b.y.download()) ASSERT_TRUE(std::isnan(v)) << "the fill ran before the copy";
  cudnnSetStream(conv.handle(), nullptr);
  cudaStreamDestroy(stream);
}

// Runs algorithm `algo` of direction `d` with the workspace its query names; false when the
// emulation does not run it for this convolution.
bool runAlgorithm(Direction d, int algo, Conv& conv, const DeviceFloats& x, const DeviceFloats& w,
                  const DeviceFloats& dy, DeviceFloats& out) {
  size_t bytes = 0;
  cudnnStatus_t q;
  if (d == Direction::kForward) {
    q = cudnnGetConvolutionForwardWorkspaceSize(conv.handle(), conv.x(), conv.w(), conv.conv(), conv.y(),
                                                static_cast<cudnnConvolutionFwdAlgo_t>(algo), &bytes);
  } else if (d == Direction::kData) {
    q = cudnnGetConvolutionBackwardDataWorkspaceSize(conv.handle(), conv.w(), conv.y(), conv.conv(), conv.x(),
                                                     static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), &bytes);
  } else {
    q = cudnnGetConvolutionBackwardFilterWorkspaceSize(conv.handle(), conv.x(), conv.y(), conv.conv(), conv.w(),
                                                       static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), &bytes);
  }
  if (q == CUDNN_STATUS_NOT_SUPPORTED) return false;
  EXPECT_EQ(q, CUDNN_STATUS_SUCCESS);
  void* ws = conv.workspace(bytes);
  const float one = 1.0f, zero = 0.0f;
  cudnnStatus_t s;
  if (d == Direction::kForward) {
    s = cudnnConvolutionForward(conv.handle(), &one, conv.x(), x.get(), conv.w(), w.get(), conv.conv(),
                                static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws, bytes, &zero, conv.y(), out.get());
  } else if (d == Direction::kData) {
    s = cudnnConvolutionBackwardData(conv.handle(), &one, conv.w(), w.get(), conv.y(), dy.get(), conv.conv(),
                                     static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ws, bytes, &zero, conv.x(),
                                     out.get());
  } else {
    s = cudnnConvolutionBackwardFilter(conv.handle(), &one, conv.x(), x.get(), conv.y(), dy.get(), conv.conv(),
                                       static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), ws, bytes, &zero, conv.w(),
                                       out.get());
  }
  EXPECT_EQ(s, CUDNN_STATUS_SUCCESS) << "algorithm " << algo;
  return true;
}

std::vector<float> reference(Direction d, const ConvCase& cc, const std::vector<float>& x, const std::vector<float>& w,
                             const std::vector<float>& dy) {
  if (d == Direction::kForward) return referenceForward(cc, x, w);
  if (d == Direction::kData) return referenceBackwardData(cc, w, dy);
  return referenceBackwardFilter(cc, x, dy);
}

// The largest relative difference from the reference (all positive here).
double worstRelative(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]) / std::abs(want[i]));
  }
  return worst;
}

// The mantissa bits an algorithm keeps of its operands, as cudasim/cudnn_algorithms.h says: all 23
// for the GEMM family, 14 for Winograd, 15 for FFT.
int keptBits(Direction d, int algo) {
  if (gemmFamily(d).count(algo)) return 23;
  const bool fft =
      d == Direction::kForward ? algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT || algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING
      : d == Direction::kData
          ? algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING
          : algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING;
  return fft ? 15 : 14;
}

// Small integers: every algorithm exact. Fractions: every algorithm within float rounding (1e-5) of
// the reference computed from its operands as it rounds them (the GEMM family: not at all).
TEST(CudasimCudnnAlgorithms, EveryAlgorithmComputesTheConvolutionFromItsRoundedOperands) {
  const ConvCase& cc = kSmall3x3;
  Conv conv(cc);
  const std::vector<float> ix = smallIntegers(cc.xCount(), 1), iw = smallIntegers(cc.wCount(), 2);
  const std::vector<float> idy = smallIntegers(cc.yCount(), 3);
  const std::vector<float> fx = fractions(cc.xCount(), 1), fw = fractions(cc.wCount(), 2);
  const std::vector<float> fdy = fractions(cc.yCount(), 3);
  for (Direction d : {Direction::kForward, Direction::kData, Direction::kFilter}) {
    SCOPED_TRACE(name(d));
    const size_t outCount = d == Direction::kForward ? cc.yCount() : d == Direction::kData ? cc.xCount() : cc.wCount();
    int ran = 0;
    for (int algo = 0; algo < algoCount(d); ++algo) {
      SCOPED_TRACE("algorithm " + std::to_string(algo));
      DeviceFloats x(ix), w(iw), dy(idy), out(std::vector<float>(outCount, NAN));
      if (!runAlgorithm(d, algo, conv, x, w, dy, out)) continue;
      ++ran;
      EXPECT_EQ(out.download(), reference(d, cc, ix, iw, idy));
      DeviceFloats x2(fx), w2(fw), dy2(fdy), out2(std::vector<float>(outCount, NAN));
      ASSERT_TRUE(runAlgorithm(d, algo, conv, x2, w2, dy2, out2));
      const int bits = keptBits(d, algo);
      const std::vector<float> want = reference(d, cc, roundedTo(fx, bits), roundedTo(fw, bits), roundedTo(fdy, bits));
      EXPECT_LE(worstRelative(out2.download(), want), 1e-5);
    }
    // All but DIRECT (forward) and the fused Winograd (filter), which the emulation does not run.
    EXPECT_EQ(ran, algoCount(d) - (d == Direction::kData ? 0 : 1));
  }
}

// One input element and the kernel's centre tap (the others read padding): y = x · 1. The GEMM
// family keeps x = 1 + 2^-20 exactly; Winograd and FFT drop its low bits and give 1.
TEST(CudasimCudnnAlgorithms, WinogradAndFftDropLowMantissaBits) {
  const ConvCase one{.n = 1, .c = 1, .h = 1, .w = 1, .k = 1, .r = 3, .s = 3, .padH = 1, .padW = 1};
  Conv conv(one);
  const float fine = 1.0f + 1.0f / (1 << 20);
  std::vector<float> centre(9, 0.0f);
  centre[4] = 1.0f;
  DeviceFloats x({fine}), w(centre), dy({fine});
  for (int algo = 0; algo < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; ++algo) {
    DeviceFloats y({0.0f});
    if (!runAlgorithm(Direction::kForward, algo, conv, x, w, dy, y)) continue;
    EXPECT_EQ(y.download()[0], keptBits(Direction::kForward, algo) == 23 ? fine : 1.0f) << "algorithm " << algo;
  }
}

}  // namespace
