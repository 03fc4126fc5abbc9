// Per-channel sums on the GPU: db[c] = Σ_o Σ_i x[o, c, i] for x laid out [outer, channels, inner],
// the bias gradient of nn::Linear (outer = rows, inner = 1) and of nn::Conv2d on NCHW (outer = N,
// inner = H·W), over raw device pointers, enqueued on an explicit stream.
//
// Conventions are kernels.h's: pointers are float32 (x may be bf16: a bias gradient in mixed
// precision, summed in float all the same) device memory on the stream's device, contiguous,
// alive until the stream has run the kernels; the call enqueues its kernels on `stream` (a CUDA
// stream; a CPU stream fails a CHECK) and returns without waiting; launch errors throw cohort::Error.
// The caller owns the scratch buffer (channelSumScratchFloats floats, from its allocator: nothing is
// allocated here) and must not touch it until the stream has run the kernels. The sum is added in
// an order fixed by the shape alone (no atomics, nothing sized from the device), so the same inputs
// give the same bits on every run and on every GPU model. Thread safety: no state; ordering is the
// stream's. Only built when CUDA is compiled in.
//
//   ensureShape(scratch, Shape{cuda::channelSumScratchFloats(shape)}, gpu.allocator());
//   cuda::channelSum({.x = dy, .sums = db, .scratch = scratch.data()},
//                    {.outer = rows, .channels = out, .inner = 1, .accumulate = false}, stream);
#pragma once

#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/stream.h"

namespace cohort::runtime::cuda {

// x is [outer, channels, inner]; the sums run over outer and inner.
struct ChannelSumOptions {
  int64_t outer = 0, channels = 0, inner = 1;
  bool accumulate = false;  // add to sums instead of overwriting them
};

struct ChannelSumBuffers {
  const void* x = nullptr;  // [outer, channels, inner] of xType: fp32, or bf16 when inner == 1
  DType xType = DType::kF32;
  float* sums = nullptr;     // [channels]
  float* scratch = nullptr;  // channelSumScratchFloats(options) floats; not x or sums
};

// Floats of device scratch channelSum needs (0 when there is nothing to sum).
int64_t channelSumScratchFloats(const ChannelSumOptions& options);

// sums[c] = Σ x[o, c, i] (+= with accumulate; with no elements that is 0, or sums unchanged).
// Two kernels. Stage 1 cuts each channel's outer·inner elements into chunks whose size depends only
// on the shape, and a block sums one chunk of a tile of channels in float, in a fixed order, into
// scratch [chunks, channels]; stage 2 adds each channel's chunk partials on one warp (lane l takes
// chunks l, l + 32, ..., then a fixed butterfly). With inner == 1 a block is 32 channels (threads
// along the contiguous channels) by 8 thread rows over a chunk of rows; otherwise a block is one
// channel with 256 threads along the contiguous inner elements. The result is a float sum of outer·inner terms: within (outer·inner)·2⁻²⁴·Σ|x| of the
// exact sum (the bound of any summation order; tests/runtime/cuda:reduce_kernels_test checks it).
void channelSum(const ChannelSumBuffers& buffers, const ChannelSumOptions& options, const Stream& stream);

}  // namespace cohort::runtime::cuda
