// im2col and col2im: the unfolding of NCHW samples that turns a 2-D convolution into one GEMM
// (Conv2d's CPU path, nn/conv2d.h), and its adjoint.
//
// Row (c, u, v) of one sample's column matrix holds, for every output position (i, j), the input
// element x[c, i·stride − padding + u, j·stride − padding + v], or 0 where that lies in the padding:
//
//   col[(c·kh + u)·kw + v, (i − rowBegin)·OW + j]     for output rows i in [rowBegin, rowEnd)
//
// A band of output rows is unfolded at a time (Conv2d's tiles). `ld` is the column buffer's row
// length, so that several samples' columns can sit side by side. CPU only; pure functions of their
// arguments, safe to call from any number of threads on disjoint outputs. Stride 1 (the common
// case) has AVX2 kernels where the build targets AVX2.
#pragma once

#include <cstdint>
#include <utility>

namespace cohort::nn {

struct Unfolding {
  int64_t channels, height, width;  // of the input sample
  int64_t kh, kw, stride, padding;
  int64_t outHeight, outWidth;

  int64_t rows() const { return channels * kh * kw; }
  // Output positions k (along one axis) whose input position k·stride − padding + offset lies in
  // [0, size): [begin, end).
  std::pair<int64_t, int64_t> valid(int64_t offset, int64_t size, int64_t outSize) const;
};

// Writes the column matrix of output rows [rowBegin, rowEnd) of sample x ([C, H, W]) into col.
void im2col(const Unfolding& u, const float* x, int64_t rowBegin, int64_t rowEnd, float* col, int64_t ld);

// The adjoint: dx[c, ih, iw] += every column-matrix element of output rows [rowBegin, rowEnd) that
// im2col would have read from there.
void col2im(const Unfolding& u, const float* col, int64_t ld, int64_t rowBegin, int64_t rowEnd, float* dx);

}  // namespace cohort::nn
