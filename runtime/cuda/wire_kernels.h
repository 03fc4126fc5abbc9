// The wire messages of runtime/wire.h on the GPU: fp32 elements packed into 16-bit words (rounded
// to bf16, or exactly as two words) and unpacked back, segment by segment, by a table in device
// memory (ZeRO's bf16 parameter gathers; train/placement/gather_plan.h). kernels.h's conventions:
// device memory on the stream's device, alive until the stream has run the kernel; each call
// enqueues one kernel (a block per segment, grid-strided over the table) and returns; an empty table
// enqueues nothing; launch errors throw cohort::Error. The rounding is __float2bfloat16_rn, the one
// nn::Linear's bf16 copy of its weight uses, so an unpacked bf16 element is exactly what a bf16
// pass reads; the exact form moves bits. Segments must not overlap in what they write.
// Thread safety: no state; ordering is the stream's. Only built when CUDA is compiled in.
//
//   packWire(shardPiece, slot, table, segments, stream);   // table: `segments` WireSegments on the device
//   unpackWire(gathered, window, table, segments, stream);
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/stream.h"
#include "runtime/wire.h"

namespace cohort::runtime::cuda {

// wire[s.wire ...] = dense[s.dense ...] in s.form, for the `segments` entries of `table`.
void packWire(const float* dense, uint16_t* wire, const WireSegment* table, size_t segments, const Stream& stream);
// dense[s.dense ...] = wire[s.wire ...] widened (bf16) or as bits (exact), for every segment.
void unpackWire(const uint16_t* wire, float* dense, const WireSegment* table, size_t segments, const Stream& stream);

}  // namespace cohort::runtime::cuda
