// cudasim's cuDNN (cudasim/cudnn.cc): the convolution's forward, backward-data, backward-filter and
// bias computations and cudnnAddTensor give a direct CPU reference's results under the real
// conventions (NCHW or NHWC tensors, KCRS filters, padding, stride and dilation per axis,
// cross-correlation, alpha/beta blending); the heuristics and workspace queries answer sanely and
// the workspace they ask for is checked; bad descriptors and arguments are the real statuses; and a
// wrong layout (swapped filter dimensions, a flipped kernel, NHWC for NCHW) gives a wrong result or
// an error rather than a silently right one. Most data are small integers, so every product and
// partial sum is exact in any order: the emulation (im2col and oneDNN's sgemm, fp32, in its own
// order) and the double-accumulating references here give equal bits. The inexact-data test
// compares within a relative 1e-5 instead, on positive data, so that no cancellation turns float
// rounding into a large relative error.
#include "cudnn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "tests/cudasim/cudnn_test_support.h"

namespace {

using namespace cudasim::testing;

// Padding, stride and dilation, each different along the two axes.
std::vector<ConvCase> cases() {
  std::vector<ConvCase> all(4);
  all[1].padH = 1, all[1].padW = 2, all[1].strideH = 2, all[1].strideW = 1;
  all[2].padH = 0, all[2].padW = 1, all[2].strideW = 2, all[2].dilationH = 2, all[2].k = 1;
  all[3].w = 9, all[3].padH = 2, all[3].padW = 0, all[3].strideW = 3, all[3].dilationW = 2;
  return all;
}

TEST(CudasimCudnn, ConvolutionForwardAndBackwardMatchADirectReference) {
  for (const ConvCase& cc : cases()) {
    SCOPED_TRACE("pad " + std::to_string(cc.padH) + "," + std::to_string(cc.padW) + " stride " +
                 std::to_string(cc.strideH) + "," + std::to_string(cc.strideW));
    Conv conv(cc);
    const std::vector<float> x = smallIntegers(cc.xCount(), 1), w = smallIntegers(cc.wCount(), 2);
    const std::vector<float> dy = smallIntegers(cc.yCount(), 3);
    DeviceFloats dx(x), dw(w), ddy(dy);
    DeviceFloats y(std::vector<float>(cc.yCount(), NAN)), gx(std::vector<float>(cc.xCount(), NAN));
    DeviceFloats gw(std::vector<float>(cc.wCount(), NAN));
    // beta = 0 on NaN outputs: cuDNN does not read them.
    ASSERT_EQ(conv.forward(1, dx.get(), dw.get(), 0, y.get()), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(conv.backwardData(1, dw.get(), ddy.get(), 0, gx.get()), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(conv.backwardFilter(1, dx.get(), ddy.get(), 0, gw.get()), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(y.download(), referenceForward(cc, x, w));
    EXPECT_EQ(gx.download(), referenceBackwardData(cc, w, dy));
    EXPECT_EQ(gw.download(), referenceBackwardFilter(cc, x, dy));
  }
}

TEST(CudasimCudnn, NhwcTensorsAndKrscFiltersMatchTheReferenceToo) {
  const ConvCase cc = cases()[1];
  Conv conv(cc, CUDNN_TENSOR_NHWC);
  const std::vector<float> x = smallIntegers(cc.xCount(), 1), w = smallIntegers(cc.wCount(), 2);
  DeviceFloats dx(toNhwc(x, cc.n, cc.c, cc.h, cc.w)), dw(toNhwc(w, cc.k, cc.c, cc.r, cc.s));
  DeviceFloats y(std::vector<float>(cc.yCount()));
  ASSERT_EQ(conv.forward(1, dx.get(), dw.get(), 0, y.get()), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(fromNhwc(y.download(), cc.n, cc.k, cc.outH(), cc.outW()), referenceForward(cc, x, w));
}

// The backward passes read NHWC dy and x and write NHWC dx and KRSC dw as the forward pass reads them.
TEST(CudasimCudnn, NhwcBackwardPassesMatchTheReferenceToo) {
  for (const ConvCase& cc : cases()) {
    Conv conv(cc, CUDNN_TENSOR_NHWC);
    const std::vector<float> x = smallIntegers(cc.xCount(), 1), w = smallIntegers(cc.wCount(), 2);
    const std::vector<float> dy = smallIntegers(cc.yCount(), 3);
    DeviceFloats dx(toNhwc(x, cc.n, cc.c, cc.h, cc.w)), dw(toNhwc(w, cc.k, cc.c, cc.r, cc.s));
    DeviceFloats ddy(toNhwc(dy, cc.n, cc.k, cc.outH(), cc.outW()));
    DeviceFloats gx(std::vector<float>(cc.xCount(), NAN)), gw(std::vector<float>(cc.wCount(), NAN));
    ASSERT_EQ(conv.backwardData(1, dw.get(), ddy.get(), 0, gx.get()), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(conv.backwardFilter(1, dx.get(), ddy.get(), 0, gw.get()), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(fromNhwc(gx.download(), cc.n, cc.c, cc.h, cc.w), referenceBackwardData(cc, w, dy));
    EXPECT_EQ(fromNhwc(gw.download(), cc.k, cc.c, cc.r, cc.s), referenceBackwardFilter(cc, x, dy));
  }
}

// CUDNN_CONVOLUTION turns the kernel in all three passes.
TEST(CudasimCudnn, FlippedKernelsMatchTheReferenceWithTheFilterTurned) {
  for (const ConvCase& cc : cases()) {
    Conv conv(cc);
    ASSERT_EQ(cudnnSetConvolution2dDescriptor(conv.conv(), cc.padH, cc.padW, cc.strideH, cc.strideW, cc.dilationH,
                                              cc.dilationW, CUDNN_CONVOLUTION, CUDNN_DATA_FLOAT),
              CUDNN_STATUS_SUCCESS);
    const std::vector<float> x = smallIntegers(cc.xCount(), 1), w = smallIntegers(cc.wCount(), 2);
    const std::vector<float> dy = smallIntegers(cc.yCount(), 3);
    DeviceFloats dx(x), dw(w), ddy(dy), y(std::vector<float>(cc.yCount())), gx(std::vector<float>(cc.xCount()));
    DeviceFloats gw(std::vector<float>(cc.wCount()));
    ASSERT_EQ(conv.forward(1, dx.get(), dw.get(), 0, y.get()), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(conv.backwardData(1, dw.get(), ddy.get(), 0, gx.get()), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(conv.backwardFilter(1, dx.get(), ddy.get(), 0, gw.get()), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(y.download(), referenceForward(cc, x, flipped(cc, w)));
    EXPECT_EQ(gx.download(), referenceBackwardData(cc, flipped(cc, w), dy));
    EXPECT_EQ(gw.download(), flipped(cc, referenceBackwardFilter(cc, x, dy)));
  }
}

// Every element within a relative `rel` of the reference's (exactly 0 where the reference is 0).
void expectWithin(const std::vector<float>& got, const std::vector<double>& want, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::abs(got[i] - want[i]), rel * std::abs(want[i])) << what << " element " << i;
  }
}

// alpha · conv + beta · out0, in double.
std::vector<double> blended(float alpha, const std::vector<float>& conv, float beta, const std::vector<float>& out0) {
  std::vector<double> out(conv.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<double>(alpha) * conv[i] + static_cast<double>(beta) * out0[i];
  }
  return out;
}

// Values that round, on a shape with several images, channels and strides, blended into outputs
// that are there: within float rounding of the references, in fp32 and in TF32 (whose reference
// reads TF32-rounded inputs).
TEST(CudasimCudnn, InexactDataAreWithinFloatRoundingOfTheReference) {
  const ConvCase cc{.n = 3, .c = 7, .h = 11, .w = 13, .k = 6, .r = 3, .s = 3, .padW = 2, .strideW = 2};
  const std::vector<float> x = fractions(cc.xCount(), 1), w = fractions(cc.wCount(), 2);
  const std::vector<float> dy = fractions(cc.yCount(), 3), y0 = fractions(cc.yCount(), 4);
  const std::vector<float> x0 = fractions(cc.xCount(), 5), w0 = fractions(cc.wCount(), 6);
  for (cudnnMathType_t math : {CUDNN_FMA_MATH, CUDNN_DEFAULT_MATH}) {
    SCOPED_TRACE(math == CUDNN_FMA_MATH ? "fp32" : "TF32");
    Conv conv(cc);
    ASSERT_EQ(cudnnSetConvolutionMathType(conv.conv(), math), CUDNN_STATUS_SUCCESS);
    DeviceFloats dx(x), dw(w), ddy(dy), y(y0), gx(x0), gw(w0);
    ASSERT_EQ(conv.forward(0.75f, dx.get(), dw.get(), 0.25f, y.get()), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(conv.backwardData(0.75f, dw.get(), ddy.get(), 0.25f, gx.get()), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(conv.backwardFilter(0.75f, dx.get(), ddy.get(), 0.25f, gw.get()), CUDNN_STATUS_SUCCESS);
    const bool round = math != CUDNN_FMA_MATH;
    const std::vector<float> rx = round ? tf32(x) : x, rw = round ? tf32(w) : w, rdy = round ? tf32(dy) : dy;
    expectWithin(y.download(), blended(0.75f, referenceForward(cc, rx, rw), 0.25f, y0), 1e-5, "forward");
    expectWithin(gx.download(), blended(0.75f, referenceBackwardData(cc, rw, rdy), 0.25f, x0), 1e-5, "data");
    expectWithin(gw.download(), blended(0.75f, referenceBackwardFilter(cc, rx, rdy), 0.25f, w0), 1e-5, "filter");
  }
}

TEST(CudasimCudnn, AlphaAndBetaBlendWithTheOutput) {
  const ConvCase cc = cases()[1];
  Conv conv(cc);
  const std::vector<float> x = smallIntegers(cc.xCount(), 1), w = smallIntegers(cc.wCount(), 2);
  const std::vector<float> dy = smallIntegers(cc.yCount(), 3), y0 = smallIntegers(cc.yCount(), 4);
  const std::vector<float> w0 = smallIntegers(cc.wCount(), 5);
  DeviceFloats dx(x), dw(w), ddy(dy), y(y0), gw(w0);
  ASSERT_EQ(conv.forward(2.0f, dx.get(), dw.get(), 0.5f, y.get()), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(conv.backwardFilter(1.0f, dx.get(), ddy.get(), 1.0f, gw.get()), CUDNN_STATUS_SUCCESS);  // accumulate
  const std::vector<float> conv0 = referenceForward(cc, x, w), grad = referenceBackwardFilter(cc, x, dy);
  const std::vector<float> gotY = y.download(), gotW = gw.download();
  for (size_t i = 0; i < gotY.size(); ++i) ASSERT_EQ(gotY[i], 2.0f * conv0[i] + 0.5f * y0[i]) << i;
  for (size_t i = 0; i < gotW.size(); ++i) ASSERT_EQ(gotW[i], w0[i] + grad[i]) << i;
}

// The bias gradient sums dy over batch and positions per channel; cudnnAddTensor broadcasts a
// [1, K, 1, 1] bias over y, as dnn.cc's forward adds it.
TEST(CudasimCudnn, BiasGradientAndAddTensorBroadcast) {
  const ConvCase cc = cases()[1];
  Conv conv(cc);
  const int plane = cc.outH() * cc.outW();
  const std::vector<float> dy = smallIntegers(cc.yCount(), 3), bias = {1, -2, 3, 0.5f};
  DeviceFloats ddy(dy), db(std::vector<float>(cc.k, NAN)), dbias(bias), y(dy);
  const float one = 1, zero = 0, three = 3;
  ASSERT_EQ(cudnnConvolutionBackwardBias(conv.handle(), &one, conv.y(), ddy.get(), &zero, conv.bias(), db.get()),
            CUDNN_STATUS_SUCCESS);
  std::vector<float> want(cc.k, 0.0f);
  for (size_t i = 0; i < dy.size(); ++i) want[i / plane % cc.k] += dy[i];
  EXPECT_EQ(db.download(), want);
  ASSERT_EQ(cudnnConvolutionBackwardBias(conv.handle(), &three, conv.y(), ddy.get(), &one, conv.bias(), db.get()),
            CUDNN_STATUS_SUCCESS);
  for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(db.download()[k], 4 * want[k]);

  ASSERT_EQ(cudnnAddTensor(conv.handle(), &one, conv.bias(), dbias.get(), &one, conv.y(), y.get()),
            CUDNN_STATUS_SUCCESS);
  const std::vector<float> got = y.download();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], dy[i] + bias[i / plane % cc.k]) << i;
  // A bias shaped [1, K, 2, 1] does not broadcast over OH = 3.
  cudnnTensorDescriptor_t tall;
  ASSERT_EQ(cudnnCreateTensorDescriptor(&tall), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetTensor4dDescriptor(tall, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, cc.k, 2, 1), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnAddTensor(conv.handle(), &one, tall, dbias.get(), &one, conv.y(), y.get()), CUDNN_STATUS_BAD_PARAM);
  cudnnDestroyTensorDescriptor(tall);
}

// Every algorithm the heuristics call supported gives the same result with the workspace its query
// names, and is refused with less; the unsupported ones say so in both places.
TEST(CudasimCudnn, HeuristicsAndWorkspaceQueriesAnswerSanely) {
  const ConvCase cc = cases()[1];
  Conv conv(cc);
  const std::vector<float> x = smallIntegers(cc.xCount(), 1), w = smallIntegers(cc.wCount(), 2);
  DeviceFloats dx(x), dw(w), y(std::vector<float>(cc.yCount()));
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int returned = 0;
  ASSERT_EQ(cudnnGetConvolutionForwardAlgorithm_v7(conv.handle(), conv.x(), conv.w(), conv.conv(), conv.y(),
                                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(returned, CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
  EXPECT_EQ(perf[0].status, CUDNN_STATUS_SUCCESS);
  bool sawWorkspace = false, sawUnsupported = false;
  const float one = 1, zero = 0;
  for (int i = 0; i < returned; ++i) {
    const cudnnConvolutionFwdAlgoPerf_t& p = perf[i];
    EXPECT_EQ(p.mathType, CUDNN_FMA_MATH);
    size_t bytes = 0;
    const cudnnStatus_t query = cudnnGetConvolutionForwardWorkspaceSize(conv.handle(), conv.x(), conv.w(), conv.conv(),
                                                                        conv.y(), p.algo, &bytes);
    if (p.status != CUDNN_STATUS_SUCCESS) {
      sawUnsupported = true;
      EXPECT_EQ(p.status, CUDNN_STATUS_NOT_SUPPORTED);
      EXPECT_EQ(query, CUDNN_STATUS_NOT_SUPPORTED);
      for (int j = i; j < returned; ++j) EXPECT_NE(perf[j].status, CUDNN_STATUS_SUCCESS) << "supported ones first";
      continue;
    }
    ASSERT_EQ(query, CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(bytes, p.memory);
    void* ws = conv.workspace(bytes);
    if (bytes > 0) {
      sawWorkspace = true;
      EXPECT_EQ(cudnnConvolutionForward(conv.handle(), &one, conv.x(), dx.get(), conv.w(), dw.get(), conv.conv(),
                                        p.algo, ws, bytes - 1, &zero, conv.y(), y.get()),
                CUDNN_STATUS_BAD_PARAM);
      EXPECT_EQ(cudnnConvolutionForward(conv.handle(), &one, conv.x(), dx.get(), conv.w(), dw.get(), conv.conv(),
                                        p.algo, nullptr, bytes, &zero, conv.y(), y.get()),
                CUDNN_STATUS_BAD_PARAM);
    }
    ASSERT_EQ(cudnnConvolutionForward(conv.handle(), &one, conv.x(), dx.get(), conv.w(), dw.get(), conv.conv(), p.algo,
                                      ws, bytes, &zero, conv.y(), y.get()),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(y.download(), referenceForward(cc, x, w)) << "algorithm " << p.algo;
  }
  EXPECT_TRUE(sawWorkspace && sawUnsupported);
  // Fewer asked for, fewer given; an algorithm that does not exist is a bad parameter.
  ASSERT_EQ(cudnnGetConvolutionForwardAlgorithm_v7(conv.handle(), conv.x(), conv.w(), conv.conv(), conv.y(), 1,
                                                   &returned, perf),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(returned, 1);
  size_t bytes = 0;
  EXPECT_EQ(cudnnGetConvolutionForwardWorkspaceSize(conv.handle(), conv.x(), conv.w(), conv.conv(), conv.y(),
                                                    CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &bytes),
            CUDNN_STATUS_BAD_PARAM);
  // The backward heuristics answer the same way.
  cudnnConvolutionBwdDataAlgoPerf_t data[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  ASSERT_EQ(cudnnGetConvolutionBackwardDataAlgorithm_v7(conv.handle(), conv.w(), conv.y(), conv.conv(), conv.x(),
                                                        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, data),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(returned, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
  EXPECT_EQ(data[0].status, CUDNN_STATUS_SUCCESS);
  cudnnConvolutionBwdFilterAlgoPerf_t filter[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  ASSERT_EQ(cudnnGetConvolutionBackwardFilterAlgorithm_v7(conv.handle(), conv.x(), conv.y(), conv.conv(), conv.w(),
                                                          CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, filter),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(returned, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
  EXPECT_EQ(filter[0].status, CUDNN_STATUS_SUCCESS);
}

TEST(CudasimCudnn, BadDescriptorsAndArgumentsAreTheRealStatuses) {
  const ConvCase cc = cases()[0];
  Conv conv(cc);
  DeviceFloats dx(smallIntegers(cc.xCount(), 1)), dw(smallIntegers(cc.wCount(), 2));
  DeviceFloats y(std::vector<float>(cc.yCount()));
  EXPECT_EQ(conv.forward(1, dx.get(), dw.get(), 0, y.get()), CUDNN_STATUS_SUCCESS);

  // Setting: sizes below 1, unknown enums, bad convolution parameters (as cuDNN 9 answers them).
  cudnnTensorDescriptor_t t;
  ASSERT_EQ(cudnnCreateTensorDescriptor(&t), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 0, 1, 1, 1), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnSetTensor4dDescriptor(t, static_cast<cudnnTensorFormat_t>(7), CUDNN_DATA_FLOAT, 1, 1, 1, 1),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1 << 16, 1 << 16, 1, 1),
            CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cudnnSetConvolution2dDescriptor(conv.conv(), -1, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnSetConvolution2dDescriptor(conv.conv(), 0, 0, 0, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnSetConvolutionMathType(conv.conv(), static_cast<cudnnMathType_t>(9)), CUDNN_STATUS_BAD_PARAM);

  const float one = 1, zero = 0;
  auto forwardWith = [&](cudnnTensorDescriptor_t xDesc, const void* x, const void* alpha, void* out) {
    return cudnnConvolutionForward(conv.handle(), alpha, xDesc, x, conv.w(), dw.get(), conv.conv(),
                                   CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, conv.y(), out);
  };
  EXPECT_EQ(forwardWith(conv.x(), dx.get(), &one, y.get()), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(forwardWith(t, dx.get(), &one, y.get()), CUDNN_STATUS_BAD_PARAM);  // never set
  // Channels that do not match the filter's, and an output of the wrong size.
  ASSERT_EQ(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, cc.n, cc.c + 1, cc.h, cc.w),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(forwardWith(t, dx.get(), &one, y.get()), CUDNN_STATUS_BAD_PARAM);
  ASSERT_EQ(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, cc.n, cc.c, cc.h + 1, cc.w),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(forwardWith(t, dx.get(), &one, y.get()), CUDNN_STATUS_BAD_PARAM);
  ASSERT_EQ(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_DOUBLE, cc.n, cc.c, cc.h, cc.w),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(forwardWith(t, dx.get(), &one, y.get()), CUDNN_STATUS_NOT_SUPPORTED);
  // A filter passed as a tensor (through a cast), a destroyed descriptor.
  EXPECT_EQ(forwardWith(reinterpret_cast<cudnnTensorDescriptor_t>(conv.w()), dx.get(), &one, y.get()),
            CUDNN_STATUS_BAD_PARAM);
  ASSERT_EQ(cudnnDestroyTensorDescriptor(t), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(forwardWith(t, dx.get(), &one, y.get()), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnDestroyTensorDescriptor(t), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnDestroyTensorDescriptor(nullptr), CUDNN_STATUS_SUCCESS);
  // Memory: host memory, a buffer too short, the output on top of the input; a missing alpha.
  std::vector<float> host(cc.xCount());
  EXPECT_EQ(forwardWith(conv.x(), host.data(), &one, y.get()), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(forwardWith(conv.x(), dx.get() + 1, &one, y.get()), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(forwardWith(conv.x(), dx.get(), &one, dx.get()), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(forwardWith(conv.x(), dx.get(), nullptr, y.get()), CUDNN_STATUS_BAD_PARAM);

  // A kernel longer than the padded input has no output, whatever the stride (dnn.h's outHeight()
  // rounds (1 − 2) / 2 + 1 up to 1; cuDNN refuses the shape).
  Conv tooShort(
      {.n = 1, .c = 1, .h = 1, .w = 5, .k = 1, .r = 2, .s = 2, .padH = 0, .padW = 0, .strideH = 2, .strideW = 2});
  cudnnConvolutionFwdAlgoPerf_t perf[1];
  int returned = 0;
  EXPECT_EQ(cudnnGetConvolutionForwardAlgorithm_v7(tooShort.handle(), tooShort.x(), tooShort.w(), tooShort.conv(),
                                                   tooShort.y(), 1, &returned, perf),
            CUDNN_STATUS_BAD_PARAM);

  cudnnHandle_t gone;
  ASSERT_EQ(cudnnCreate(&gone), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnDestroy(gone), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnSetStream(gone, nullptr), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnDestroy(gone), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnCreate(nullptr), CUDNN_STATUS_BAD_PARAM);
  EXPECT_STREQ(cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM), "CUDNN_STATUS_BAD_PARAM");
  EXPECT_STREQ(cudnnGetErrorString(static_cast<cudnnStatus_t>(12345)), "CUDNN_UNKNOWN_STATUS");
  EXPECT_EQ(cudnnGetVersion(), static_cast<size_t>(CUDNN_VERSION));
}

// Layout mistakes a caller can make, each caught: a filter laid out [C, K, R, S] but described
// KCRS (K == C, so the descriptors agree) computes with the wrong weights; R and S swapped give an
// output size that the output descriptor refuses; CUDNN_CONVOLUTION flips the kernel; NCHW data
// described as NHWC is read in the wrong order.
TEST(CudasimCudnn, AWrongLayoutGivesAWrongResultOrAnError) {
  ConvCase cc;
  cc.k = cc.c;
  const std::vector<float> x = smallIntegers(cc.xCount(), 1), w = smallIntegers(cc.wCount(), 2);
  const std::vector<float> right = referenceForward(cc, x, w);
  DeviceFloats dx(x), y(std::vector<float>(cc.yCount()));
  std::vector<float> ckrs(w.size());
  for (int k = 0; k < cc.k; ++k)
    for (int c = 0; c < cc.c; ++c)
      for (int r = 0; r < cc.r; ++r)
        for (int s = 0; s < cc.s; ++s) ckrs[at(cc.k, cc.r, cc.s, c, k, r, s)] = w[at(cc.c, cc.r, cc.s, k, c, r, s)];
  {
    Conv conv(cc);
    DeviceFloats dw(ckrs);
    ASSERT_EQ(conv.forward(1, dx.get(), dw.get(), 0, y.get()), CUDNN_STATUS_SUCCESS);
    EXPECT_NE(y.download(), right) << "a CKRS filter described as KCRS went unnoticed";
  }
  DeviceFloats dw(w);
  {
    ConvCase swapped = cc;
    std::swap(swapped.r, swapped.s);
    Conv conv(swapped);
    ASSERT_EQ(
        cudnnSetTensor4dDescriptor(conv.y(), CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, cc.n, cc.k, cc.outH(), cc.outW()),
        CUDNN_STATUS_SUCCESS);  // the output the caller meant
    const float one = 1, zero = 0;
    EXPECT_EQ(cudnnConvolutionForward(conv.handle(), &one, conv.x(), dx.get(), conv.w(), dw.get(), conv.conv(),
                                      CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, conv.y(), y.get()),
              CUDNN_STATUS_BAD_PARAM);
  }
  {
    Conv conv(cc);
    ASSERT_EQ(cudnnSetConvolution2dDescriptor(conv.conv(), cc.padH, cc.padW, cc.strideH, cc.strideW, 1, 1,
                                              CUDNN_CONVOLUTION, CUDNN_DATA_FLOAT),
              CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(conv.forward(1, dx.get(), dw.get(), 0, y.get()), CUDNN_STATUS_SUCCESS);
    EXPECT_NE(y.download(), right) << "a flipped kernel went unnoticed";
  }
  {
    Conv conv(cc, CUDNN_TENSOR_NHWC);
    ASSERT_EQ(conv.forward(1, dx.get(), dw.get(), 0, y.get()), CUDNN_STATUS_SUCCESS);
    EXPECT_NE(fromNhwc(y.download(), cc.n, cc.k, cc.outH(), cc.outW()), right) << "NCHW read as NHWC went unnoticed";
  }
}

// A convolution descriptor left at CUDNN_DEFAULT_MATH lets TF32 in on Ampere and later GPUs:
// 1 + 2⁻¹² is read as 1. dnn.cc sets CUDNN_FMA_MATH, which keeps fp32.
TEST(CudasimCudnn, DefaultMathRoundsToTf32AndFmaMathDoesNot) {
  ConvCase cc{.n = 1, .c = 1, .h = 1, .w = 1, .k = 1, .r = 1, .s = 1, .padH = 0, .padW = 0};
  Conv conv(cc);
  const float fine = 1.0f + 1.0f / 4096;
  DeviceFloats dx({fine}), dw({1.0f}), y({0.0f});
  ASSERT_EQ(conv.forward(1, dx.get(), dw.get(), 0, y.get()), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(y.download()[0], fine);
  ASSERT_EQ(cudnnSetConvolutionMathType(conv.conv(), CUDNN_DEFAULT_MATH), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(conv.forward(1, dx.get(), dw.get(), 0, y.get()), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(y.download()[0], 1.0f);
}

// The work runs on the handle's stream: after a copy on that stream, it sees the copied input.
TEST(CudasimCudnn, ConvolutionRunsInStreamOrderOnTheHandlesStream) {
  const ConvCase cc = cases()[0];
  Conv conv(cc);
  const std::vector<float> x = smallIntegers(cc.xCount(), 1), w = smallIntegers(cc.wCount(), 2);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudnnSetStream(conv.handle(), stream), CUDNN_STATUS_SUCCESS);
  DeviceFloats dx(std::vector<float>(cc.xCount(), NAN)), dw(w), y(std::vector<float>(cc.yCount()));
  for (int run = 0; run < 5; ++run) {
    ASSERT_EQ(cudaMemset(dx.get(), 0xFF, cc.xCount() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(dx.get(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    ASSERT_EQ(conv.forward(1, dx.get(), dw.get(), 0, y.get()), CUDNN_STATUS_SUCCESS);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(y.download(), referenceForward(cc, x, w));
  }
  cudnnSetStream(conv.handle(), nullptr);
  cudaStreamDestroy(stream);
}

}  // namespace
