// CUDA kernels of the transformer layers nn::Gelu and nn::LayerNorm (nn/gelu.h, nn/layer_norm.h),
// over raw device pointers, enqueued on an explicit stream.
//
// Conventions are kernels.h's: pointers are device memory on the stream's device, row-major and
// contiguous, float32 unless a DType says bf16 (activations of a bf16 pass: read widened to float,
// written rounded once; the arithmetic is float32 either way), alive until the stream has run the kernels; each call enqueues its kernels on
// `stream` (a CUDA stream; a CPU stream fails a CHECK) and returns without waiting; launch errors
// throw cohort::Error. Results match the CPU code in nn/ to float32 rounding (nvcc contracts a·b + c
// into FMAs, and tanhf is not std::tanh); tests/nn/gpu/gpu_norm_test.cc compares the two.
// LayerNorm's forward may add the residual stream's branch first, and its backward add the residual
// gradient and write a bf16 copy (the fused "add + LayerNorm" of a transformer block).
// LayerNorm's parameter gradients are column sums over every row; they are reduced without
// floating-point atomics, in an order fixed by the shape alone, so the same inputs give the same
// bits on every run (see layerNormBackward). Thread safety: no state; ordering is the stream's.
// Only built when CUDA is compiled in.
//
//   cuda::layerNormForward({.x = x, .weight = w, .bias = b, .y = y, .mean = mean, .rstd = rstd},
//                          {.rows = B * T, .cols = 768}, stream);
#pragma once

#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/stream.h"

namespace cohort::runtime::cuda {

// y = 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³))) over n elements (nn::Gelu); x and y of
// `type`. x may equal y.
void geluForward(const void* x, void* y, int64_t n, const Stream& stream, DType type = DType::kF32);
// dx = dy · gelu'(x), from the forward's input x; dx has x's type. dy may equal dx (same type).
void geluBackward(const void* x, const void* dy, void* dx, int64_t n, const Stream& stream, DType xType = DType::kF32,
                  DType dyType = DType::kF32);

// The matrix a LayerNorm normalises: `rows` rows of `cols` features, each row on its own.
struct LayerNormOptions {
  int64_t rows = 0, cols = 0;
  double eps = 1e-5;
  bool accumulate = false;  // backward: add to dweight and dbias instead of overwriting them
};

struct LayerNormForwardBuffers {
  const void* x = nullptr;        // [rows, cols] of xType
  // The residual stream's add fused in front (TransformerBlock, "add then normalise"): with a
  // branch, the rows normalised are s = x + branch (x fp32, branch of branchType), and s is written
  // to sum. sum may equal x.
  const void* branch = nullptr;   // [rows, cols] of branchType, or null: normalise x
  float* sum = nullptr;           // [rows, cols]; only with a branch
  const float* weight = nullptr;  // [cols]
  const float* bias = nullptr;    // [cols]
  void* y = nullptr;              // [rows, cols] of yType; not x
  float* mean = nullptr;          // [rows], for backward
  float* rstd = nullptr;          // [rows]: 1 / sqrt(var + eps), for backward
  DType xType = DType::kF32, yType = DType::kF32, branchType = DType::kF32;
};

// Per row, nn::LayerNorm's arithmetic: mean and biased variance summed in double (two passes over
// the row held in registers), rstd = float(1 / sqrt(var + eps)), y = weight · ((x − mean) · rstd) +
// bias in float; with a branch, of s = x + branch (float), written to sum in the same kernel. One
// kernel; a warp takes a row of up to 1024 columns, a block a wider one; rows move in 16-byte
// accesses where their buffers are 16-byte aligned, element by element otherwise (a width that
// is not a multiple of 8 elements: the scalar tail).
void layerNormForward(const LayerNormForwardBuffers& buffers, const LayerNormOptions& options, const Stream& stream);

struct LayerNormBackwardBuffers {
  const void* dy = nullptr;       // [rows, cols] of dyType
  const void* x = nullptr;        // the forward's input, of xType
  const float* weight = nullptr;  // [cols]
  const float* mean = nullptr;    // [rows], from layerNormForward
  const float* rstd = nullptr;    // [rows], from layerNormForward
  float* dweight = nullptr;       // [cols]
  float* dbias = nullptr;         // [cols]
  void* dx = nullptr;             // [rows, cols] of xType, or null: no input gradient; not dy or x
  // The residual stream's gradient accumulated in the same kernel (TransformerBlock): dx =
  // residualGrad + LayerNorm's input gradient. May equal dx. Only with dx.
  const float* residualGrad = nullptr;  // [rows, cols], or null
  void* dx16 = nullptr;  // [rows, cols] of bf16: dx rounded once, for a bf16 product that reads it; or null
  float* scratch = nullptr;       // layerNormScratchFloats(rows, cols) floats
  DType dyType = DType::kF32, xType = DType::kF32;
};

// Floats of device scratch layerNormBackward needs for a [rows, cols] input (0 for no rows).
int64_t layerNormScratchFloats(int64_t rows, int64_t cols);

// xhat = (x − mean) · rstd recomputed per element, then
//   dx = [residualGrad +] rstd · (g − mean(g) − xhat · mean(g · xhat)), g = dy · weight (row sums in
//   double), and dx16 = bf16(dx) when asked;
//   dweight = Σ_rows dy · xhat, dbias = Σ_rows dy (+= with accumulate; 0 for no rows).
// Two kernels. The first reads dy and x once (a row held in registers, 16-byte accesses as the
// forward's): the rows are cut into chunks (their number and size depend only on rows), a block
// takes one chunk, its row groups its rows in turn, and besides dx it sums each column of its chunk
// (float per row group, the groups added in a fixed order) into scratch. The second gives each
// column one warp, which adds the column's chunk sums in double in a fixed order. So every run with
// the same shape adds in the same order.
void layerNormBackward(const LayerNormBackwardBuffers& buffers, const LayerNormOptions& options, const Stream& stream);

}  // namespace cohort::runtime::cuda
