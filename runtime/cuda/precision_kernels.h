// Conversions between fp32 and bf16 on the GPU (mixed precision; docs/gpu.md, "Precision"): an
// activation entering a layer that computes in fp32, a gradient going back, the bf16 copy of the
// fp32 master weights. kernels.h's conventions: device memory on the stream's device, alive until
// the stream has run the kernel; each call enqueues one kernel and returns; empty work enqueues
// nothing; launch errors throw cohort::Error. Rounding to bf16 is to nearest, ties to even (NaN
// stays NaN, ±inf stays, a finite value beyond bf16's range becomes ±inf), exactly
// runtime::toBf16; widening is exact.
// Thread safety: no state; ordering is the stream's. Only built when CUDA is compiled in.
//
//   convertToBf16(x, x16, n, stream);     // x: n floats; x16: n bf16 (2 bytes each)
//   convertToFloat(dy16, dy, n, stream);
//   addMixed(x, attn16, DType::kBF16, h, n, stream);  // h = x + attn
#pragma once

#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/stream.h"

namespace cohort::runtime::cuda {

// out[i] = bf16(in[i]); `out` holds n two-byte elements.
void convertToBf16(const float* in, void* out, int64_t n, const Stream& stream);
// out[i] = float(in[i]); `in` holds n two-byte bf16 elements.
void convertToFloat(const void* in, float* out, int64_t n, const Stream& stream);
// out[r, c] = bf16(bias[c]) over [rows, cols]: a bf16 layer's bias, rounded as PyTorch's autocast
// rounds it, as the C that the layer's product then adds to (beta = 1: one more rounding in all).
void broadcastToBf16(const float* bias, void* out, int64_t rows, int64_t cols, const Stream& stream);
// out[i] = a[i] + float(b[i]) over n elements, b of bType (fp32, or bf16 widened exactly): the
// residual stream (fp32) plus a branch's output or gradient, in one pass. out may equal a.
void addMixed(const float* a, const void* b, DType bType, float* out, int64_t n, const Stream& stream);
// data[r, c] = value for c in [firstCol, cols) over [rows, cols] of `type` (fp32, or bf16 rounded
// once): a GPT's logits of a padded vocabulary's extra ids set to −inf, so no softmax counts them.
void fillColumns(void* data, DType type, int64_t rows, int64_t cols, int64_t firstCol, float value,
                 const Stream& stream);

}  // namespace cohort::runtime::cuda
