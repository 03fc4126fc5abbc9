// What the tests of cudasim's cuDNN share (tests/cudasim): device buffers, convolution shapes and
// data, direct double-accumulating references, and a handle with one convolution's descriptors.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "cudnn.h"

namespace cudasim::testing {

// A device copy of a host vector of floats.
class DeviceFloats {
 public:
  explicit DeviceFloats(const std::vector<float>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&p_, n_ * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p_, host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(p_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;

  float* get() const { return p_; }
  // Waits for the default stream's work (the handle's stream), then copies.
  std::vector<float> download() const {
    std::vector<float> host(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  size_t n_;
  float* p_ = nullptr;
};

inline std::vector<float> smallIntegers(size_t n, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<int>((i * 5 + seed * 3) % 7) - 3);
  return v;
}

// n values in [0.5, 1.5), none exactly representable in few bits: sums of them round.
inline std::vector<float> fractions(size_t n, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.5f + static_cast<float>(std::fmod(i * 0.6180339887 + seed * 0.137, 1.0));
  return v;
}

// Each x rounded to `bits` explicit mantissa bits, to nearest with ties to even (the default
// rounding mode of nearbyint), written apart from the emulation's bit manipulation.
inline std::vector<float> roundedTo(std::vector<float> v, int bits) {
  for (float& x : v) {
    if (x == 0.0f || !std::isfinite(x)) continue;
    int exponent = 0;
    const double mantissa = std::frexp(static_cast<double>(x), &exponent);  // in [0.5, 1): bits + 1 kept
    x = static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(mantissa, bits + 1)), exponent - bits - 1));
  }
  return v;
}

// x rounded to TF32's 10 explicit mantissa bits.
inline std::vector<float> tf32(std::vector<float> v) { return roundedTo(std::move(v), 10); }

// Input [n, c, h, w], filter [k, c, r, s], output [n, k, outH(), outW()].
struct ConvCase {
  int n = 2, c = 3, h = 5, w = 6, k = 4, r = 3, s = 2;
  int padH = 1, padW = 1, strideH = 1, strideW = 1, dilationH = 1, dilationW = 1;
  int outH() const { return (h + 2 * padH - (r - 1) * dilationH - 1) / strideH + 1; }
  int outW() const { return (w + 2 * padW - (s - 1) * dilationW - 1) / strideW + 1; }
  size_t xCount() const { return static_cast<size_t>(n) * c * h * w; }
  size_t wCount() const { return static_cast<size_t>(k) * c * r * s; }
  size_t yCount() const { return static_cast<size_t>(n) * k * outH() * outW(); }
};

// Row-major offsets of 4-D arrays.
inline size_t at(int d1, int d2, int d3, int i0, int i1, int i2, int i3) {
  return ((static_cast<size_t>(i0) * d1 + i1) * d2 + i2) * d3 + i3;
}

// The input row and column that output (p, q) reads at kernel offset (r, s), or -1 in the padding.
inline int inRow(const ConvCase& cc, int p, int r) {
  const int i = p * cc.strideH - cc.padH + r * cc.dilationH;
  return i >= 0 && i < cc.h ? i : -1;
}
inline int inCol(const ConvCase& cc, int q, int s) {
  const int i = q * cc.strideW - cc.padW + s * cc.dilationW;
  return i >= 0 && i < cc.w ? i : -1;
}

// y[n, k, p, q] = Σ over c, r, s of x[n, c, p·u − padH + r·dilationH, ...] · w[k, c, r, s].
inline std::vector<float> referenceForward(const ConvCase& cc, const std::vector<float>& x,
                                           const std::vector<float>& w) {
  std::vector<float> y(cc.yCount());
  for (int n = 0; n < cc.n; ++n)
    for (int k = 0; k < cc.k; ++k)
      for (int p = 0; p < cc.outH(); ++p)
        for (int q = 0; q < cc.outW(); ++q) {
          double sum = 0;
          for (int c = 0; c < cc.c; ++c)
            for (int r = 0; r < cc.r; ++r)
              for (int s = 0; s < cc.s; ++s) {
                const int i = inRow(cc, p, r), j = inCol(cc, q, s);
                if (i >= 0 && j >= 0) sum += x[at(cc.c, cc.h, cc.w, n, c, i, j)] * w[at(cc.c, cc.r, cc.s, k, c, r, s)];
              }
          y[at(cc.k, cc.outH(), cc.outW(), n, k, p, q)] = static_cast<float>(sum);
        }
  return y;
}

// dx[n, c, i, j] = Σ over the (k, p, q, r, s) whose tap reads (i, j) of dy[n, k, p, q] · w[k, c, r, s].
inline std::vector<float> referenceBackwardData(const ConvCase& cc, const std::vector<float>& w,
                                                const std::vector<float>& dy) {
  std::vector<float> dx(cc.xCount());
  for (int n = 0; n < cc.n; ++n)
    for (int c = 0; c < cc.c; ++c)
      for (int i = 0; i < cc.h; ++i)
        for (int j = 0; j < cc.w; ++j) {
          double sum = 0;
          for (int k = 0; k < cc.k; ++k)
            for (int p = 0; p < cc.outH(); ++p)
              for (int q = 0; q < cc.outW(); ++q)
                for (int r = 0; r < cc.r; ++r)
                  for (int s = 0; s < cc.s; ++s) {
                    if (inRow(cc, p, r) != i || inCol(cc, q, s) != j) continue;
                    sum += dy[at(cc.k, cc.outH(), cc.outW(), n, k, p, q)] * w[at(cc.c, cc.r, cc.s, k, c, r, s)];
                  }
          dx[at(cc.c, cc.h, cc.w, n, c, i, j)] = static_cast<float>(sum);
        }
  return dx;
}

// dw[k, c, r, s] = Σ over n, p, q of dy[n, k, p, q] · x[n, c, p·u − padH + r·dilationH, ...].
inline std::vector<float> referenceBackwardFilter(const ConvCase& cc, const std::vector<float>& x,
                                                  const std::vector<float>& dy) {
  std::vector<float> dw(cc.wCount());
  for (int k = 0; k < cc.k; ++k)
    for (int c = 0; c < cc.c; ++c)
      for (int r = 0; r < cc.r; ++r)
        for (int s = 0; s < cc.s; ++s) {
          double sum = 0;
          for (int n = 0; n < cc.n; ++n)
            for (int p = 0; p < cc.outH(); ++p)
              for (int q = 0; q < cc.outW(); ++q) {
                const int i = inRow(cc, p, r), j = inCol(cc, q, s);
                if (i >= 0 && j >= 0) {
                  sum += dy[at(cc.k, cc.outH(), cc.outW(), n, k, p, q)] * x[at(cc.c, cc.h, cc.w, n, c, i, j)];
                }
              }
          dw[at(cc.c, cc.r, cc.s, k, c, r, s)] = static_cast<float>(sum);
        }
  return dw;
}

// [d0, d1, d2, d3] row-major to [d0, d2, d3, d1] (NCHW to NHWC, KCRS to KRSC), and back.
inline std::vector<float> toNhwc(const std::vector<float>& v, int d0, int d1, int d2, int d3) {
  std::vector<float> out(v.size());
  for (int a = 0; a < d0; ++a)
    for (int b = 0; b < d1; ++b)
      for (int c = 0; c < d2; ++c)
        for (int d = 0; d < d3; ++d) out[at(d2, d3, d1, a, c, d, b)] = v[at(d1, d2, d3, a, b, c, d)];
  return out;
}
inline std::vector<float> fromNhwc(const std::vector<float>& v, int d0, int d1, int d2, int d3) {
  std::vector<float> out(v.size());
  for (int a = 0; a < d0; ++a)
    for (int b = 0; b < d1; ++b)
      for (int c = 0; c < d2; ++c)
        for (int d = 0; d < d3; ++d) out[at(d1, d2, d3, a, b, c, d)] = v[at(d2, d3, d1, a, c, d, b)];
  return out;
}

// A KCRS filter with each kernel turned by 180 degrees: CUDNN_CONVOLUTION with w is
// CUDNN_CROSS_CORRELATION with flipped(w), and its filter gradient is the flipped one.
inline std::vector<float> flipped(const ConvCase& cc, const std::vector<float>& w) {
  std::vector<float> out(w.size());
  for (int k = 0; k < cc.k; ++k)
    for (int c = 0; c < cc.c; ++c)
      for (int r = 0; r < cc.r; ++r)
        for (int s = 0; s < cc.s; ++s)
          out[at(cc.c, cc.r, cc.s, k, c, r, s)] = w[at(cc.c, cc.r, cc.s, k, c, cc.r - 1 - r, cc.s - 1 - s)];
  return out;
}

// A handle and the descriptors of one convolution, set as runtime/cuda/dnn.cc sets them (FMA math).
class Conv {
 public:
  explicit Conv(const ConvCase& cc, cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW) : cc_(cc) {
    EXPECT_EQ(cudnnCreate(&handle_), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateTensorDescriptor(&x_), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateTensorDescriptor(&y_), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateTensorDescriptor(&bias_), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateFilterDescriptor(&w_), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateConvolutionDescriptor(&conv_), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetTensor4dDescriptor(x_, format, CUDNN_DATA_FLOAT, cc.n, cc.c, cc.h, cc.w), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetTensor4dDescriptor(y_, format, CUDNN_DATA_FLOAT, cc.n, cc.k, cc.outH(), cc.outW()),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetTensor4dDescriptor(bias_, format, CUDNN_DATA_FLOAT, 1, cc.k, 1, 1), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetFilter4dDescriptor(w_, CUDNN_DATA_FLOAT, format, cc.k, cc.c, cc.r, cc.s), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetConvolution2dDescriptor(conv_, cc.padH, cc.padW, cc.strideH, cc.strideW, cc.dilationH,
                                              cc.dilationW, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetConvolutionMathType(conv_, CUDNN_FMA_MATH), CUDNN_STATUS_SUCCESS);
  }
  ~Conv() {
    cudnnDestroyTensorDescriptor(x_);
    cudnnDestroyTensorDescriptor(y_);
    cudnnDestroyTensorDescriptor(bias_);
    cudnnDestroyFilterDescriptor(w_);
    cudnnDestroyConvolutionDescriptor(conv_);
    cudnnDestroy(handle_);
    if (workspace_) cudaFree(workspace_);
  }
  Conv(const Conv&) = delete;
  Conv& operator=(const Conv&) = delete;

  // The first algorithm the heuristics offer, with a workspace of the size its query gives.
  cudnnStatus_t forward(float alpha, const float* x, const float* w, float beta, float* y) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int returned = 0;
    EXPECT_EQ(cudnnGetConvolutionForwardAlgorithm_v7(handle_, x_, w_, conv_, y_, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                     &returned, perf),
              CUDNN_STATUS_SUCCESS);
    size_t bytes = 0;
    EXPECT_EQ(cudnnGetConvolutionForwardWorkspaceSize(handle_, x_, w_, conv_, y_, perf[0].algo, &bytes),
              CUDNN_STATUS_SUCCESS);
    return cudnnConvolutionForward(handle_, &alpha, x_, x, w_, w, conv_, perf[0].algo, workspace(bytes), bytes, &beta,
                                   y_, y);
  }
  cudnnStatus_t backwardData(float alpha, const float* w, const float* dy, float beta, float* dx) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int returned = 0;
    EXPECT_EQ(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle_, w_, y_, conv_, x_,
                                                          CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf),
              CUDNN_STATUS_SUCCESS);
    size_t bytes = 0;
    EXPECT_EQ(cudnnGetConvolutionBackwardDataWorkspaceSize(handle_, w_, y_, conv_, x_, perf[0].algo, &bytes),
              CUDNN_STATUS_SUCCESS);
    return cudnnConvolutionBackwardData(handle_, &alpha, w_, w, y_, dy, conv_, perf[0].algo, workspace(bytes), bytes,
                                        &beta, x_, dx);
  }
  cudnnStatus_t backwardFilter(float alpha, const float* x, const float* dy, float beta, float* dw) {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int returned = 0;
    EXPECT_EQ(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle_, x_, y_, conv_, w_,
                                                            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, perf),
              CUDNN_STATUS_SUCCESS);
    size_t bytes = 0;
    EXPECT_EQ(cudnnGetConvolutionBackwardFilterWorkspaceSize(handle_, x_, y_, conv_, w_, perf[0].algo, &bytes),
              CUDNN_STATUS_SUCCESS);
    return cudnnConvolutionBackwardFilter(handle_, &alpha, x_, x, y_, dy, conv_, perf[0].algo, workspace(bytes), bytes,
                                          &beta, w_, dw);
  }

  cudnnHandle_t handle() const { return handle_; }
  cudnnTensorDescriptor_t x() const { return x_; }
  cudnnTensorDescriptor_t y() const { return y_; }
  cudnnTensorDescriptor_t bias() const { return bias_; }
  cudnnFilterDescriptor_t w() const { return w_; }
  cudnnConvolutionDescriptor_t conv() const { return conv_; }
  // A device workspace of at least `bytes` (nullptr for none), kept for the next call.
  void* workspace(size_t bytes) {
    if (bytes > workspaceBytes_) {
      if (workspace_) cudaFree(workspace_);
      EXPECT_EQ(cudaMalloc(&workspace_, bytes), cudaSuccess);
      workspaceBytes_ = bytes;
    }
    return bytes ? workspace_ : nullptr;
  }

 private:
  ConvCase cc_;
  cudnnHandle_t handle_ = nullptr;
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr, bias_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspaceBytes_ = 0;
};

}  // namespace cudasim::testing
