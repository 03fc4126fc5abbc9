// Element-wise reduction loops of the shm backend, written so the compiler vectorises them.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/communicator.h"

namespace cohort::collectives::shm {

inline constexpr int kMaxSources = 64;  // the shm backend serves at most 64 local ranks

// out[i] = op over k < numSources of sources[k][i], for i < count, folded in source order
// (((s0 op s1) op s2) ...); kAvg sums and then multiplies by `scale` (1/n), so avg == float(sum) *
// float(1/n) exactly on every backend that follows the docs. `out` may equal any one source (in
// place: a rank's own input, wherever it stands in the order); no other overlap is allowed.
// 1 <= numSources <= kMaxSources.
void reduceInto(float* out, const float* const* sources, int numSources, size_t count, ReduceOp op, float scale);
// The same over bf16 values (their bits): accumulated in fp32 in source order, kAvg scaled in fp32,
// and rounded to bf16 once (runtime::toBf16). `out` may equal any one source.
void reduceIntoBf16(uint16_t* out, const uint16_t* const* sources, int numSources, size_t count, ReduceOp op,
                    float scale);
// Either of the two above, by `dtype`, on untyped pointers.
void reduceInto(runtime::DType dtype, void* out, const void* const* sources, int numSources, size_t count, ReduceOp op,
                float scale);

// Copies count floats like memcpy, but with non-temporal (streaming) stores for the 32-byte-aligned
// middle of `out`, so a large output does not first read each destination line from memory nor
// evict the staging buffers from the cache. Ends with a store fence. No overlap allowed.
void copyStreaming(float* out, const float* in, size_t count);
// copyStreaming for a byte count: streaming where it is a whole number of floats, else memcpy.
void copyStreamingBytes(void* out, const void* in, size_t bytes);

}  // namespace cohort::collectives::shm
