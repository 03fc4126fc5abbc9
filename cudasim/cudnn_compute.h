// How the emulated cuDNN computes a convolution (private to cudasim/cudnn.cc, which checks the calls
// and enqueues these on the handle's stream).
//
// A convolution is matrix products, image by image, as in cuDNN's GEMM algorithms. Image n's
// columns col_n [T × P] hold, for each tap t = (c, r, s) (T = C·R·S taps, in that order) and
// output position p = (oh, ow) (P = OH·OW), the input at
//   ih = oh · strideH − padH + r · dilationH,   iw = ow · strideW − padW + s · dilationW,
// or 0 where that lies in the padding. The filter is the matrix wm [K × T], w read at (r, s), or at
// (R − 1 − r, S − 1 − s) for CUDNN_CONVOLUTION's flipped kernel. Then
//   forward          y_n  = wm · col_n                       (y_n: image n of y as a K × P matrix)
//   backward data    dx_n = each entry of wmᵀ · dy_n added back to the input position it came from
//   backward filter  dw   = Σ over n of dy_n · col_nᵀ
// by oneDNN's sgemm in fp32 (an NHWC image is the transposed matrix), and the sums are blended as
// alpha · sum + beta · out (out not read when beta == 0). So results differ from a direct
// double-accumulating reference by float rounding; and a tap in the padding contributes 0 · w, as
// in an implicit GEMM (NaN for an infinite or NaN weight, where a direct loop would skip the tap).
// Operands are read as Geometry::operand() says: TF32 for any math type but CUDNN_FMA_MATH, and
// fewer mantissa bits for the Winograd and FFT algorithms (cudnn_algorithms.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cudasim/cudnn_algorithms.h"
#include "cudnn.h"

namespace cudasim::dnn {

// A tensor's or a filter's shape and layout (a filter's n, c, h, w are its K, C, R, S).
struct Dims {
  bool set = false;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;

  size_t count() const { return static_cast<size_t>(n) * c * h * w; }
  size_t bytes() const { return count() * sizeof(float); }
  // The memory offset of element (n, c, h, w) in elements.
  int64_t at(int64_t in, int64_t ic, int64_t ih, int64_t iw) const {
    if (format == CUDNN_TENSOR_NHWC) return ((in * h + ih) * w + iw) * c + ic;
    return ((in * c + ic) * h + ih) * w + iw;
  }
  // How far apart in memory, in elements, neighbours along n, c, h and w lie.
  struct Strides {
    int64_t n, c, h, w;
  };
  Strides strides() const {
    if (format == CUDNN_TENSOR_NHWC) return {int64_t{h} * w * c, 1, int64_t{w} * c, c};
    return {int64_t{c} * h * w, int64_t{h} * w, w, 1};
  }
};

}  // namespace cudasim::dnn

// cuDNN's opaque convolution descriptor, defined here because a Geometry holds a copy of one.
struct cudnnConvolutionStruct {
  bool set = false;
  int padH = 0, padW = 0, strideH = 1, strideW = 1, dilationH = 1, dilationW = 1;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t computeType = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

namespace cudasim::dnn {

// TF32's explicit mantissa bits, which tensor cores keep of their fp32 inputs.
constexpr int kTf32Bits = 10;

// One convolution, checked: x [N, C, H, W], w [K, C, R, S], y [N, K, OH, OW].
struct Geometry {
  Dims x, w, y;
  cudnnConvolutionStruct conv;
  int algoBits = 23;  // the mantissa bits the call's algorithm keeps of its operands (cudnn_algorithms.h)

  int64_t taps() const { return int64_t{w.c} * w.h * w.w; }  // T
  int64_t positions() const { return int64_t{y.h} * y.w; }   // P
  int operandBits() const { return std::min(conv.math == CUDNN_FMA_MATH ? 23 : kTf32Bits, algoBits); }
  bool exactOperands() const { return operandBits() == 23; }
  // An input as the products read it: TF32 unless CUDNN_FMA_MATH, and as the algorithm rounds it.
  float operand(float v) const { return roundMantissa(v, operandBits()); }
  ConvSizes sizes() const {
    return {.n = x.n,
            .c = x.c,
            .h = x.h,
            .w = x.w,
            .k = w.n,
            .r = w.h,
            .s = w.w,
            .outH = y.h,
            .outW = y.w,
            .padH = conv.padH,
            .padW = conv.padW,
            .strideH = conv.strideH,
            .strideW = conv.strideW,
            .dilationH = conv.dilationH,
            .dilationW = conv.dilationW,
            .nchw = x.format == CUDNN_TENSOR_NCHW && w.format == CUDNN_TENSOR_NCHW && y.format == CUDNN_TENSOR_NCHW};
  }
};

// The memory of one convolution call: its two inputs (the third of x, w, y is null) and its output,
// and how the result is blended into the output.
struct Tensors {
  const float* x = nullptr;
  const float* w = nullptr;
  const float* y = nullptr;
  float* out = nullptr;
  float alpha = 1.0f, beta = 0.0f;  // out = alpha · the result + beta · out
};

// y = alpha · (y_n = wm · col_n for each image n) + beta · y.
void forward(const Geometry& g, const Tensors& t);
// dx = alpha · (wmᵀ · dy_n for each image n, its columns added back into x's positions) + beta · dx.
void backwardData(const Geometry& g, const Tensors& t);
// dw = alpha · (Σ over images n of dy_n · col_nᵀ, back in w's layout) + beta · dw.
void backwardFilter(const Geometry& g, const Tensors& t);

// out = alpha · value + beta · out, with out not read when beta == 0 (so NaN there does not survive).
void blendInto(float& out, double value, float alpha, float beta);

template <class T>
void blend(float* out, const std::vector<T>& sum, float alpha, float beta) {
  for (size_t i = 0; i < sum.size(); ++i) blendInto(out[i], sum[i], alpha, beta);
}

}  // namespace cudasim::dnn
