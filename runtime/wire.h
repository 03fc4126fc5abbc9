// Wire messages: fp32 elements carried in a buffer of 16-bit words, each element either rounded to
// bf16 (one word: half the bytes) or exactly (its fp32 bits as two words, the low half first). A
// table of segments says which elements go where: segment s moves `count` consecutive elements
// between dense[s.dense ...] and wire[s.wire ...] in its form. ZeRO's parameter gathers in bf16 use
// it to send the parameters a bf16 pass reads rounded as bf16 and the others exactly
// (train/placement/gather_plan.h); an all-gather moves the words as they are.
//
// Rounding is to nearest, ties to even (runtime::toBf16, the GPU's __float2bfloat16_rn); widening
// is exact, so unpacking a packed bf16 element gives the value a bf16 pass reads, and an exact one
// the element's bits. The host functions here run the table on the CPU; runtime/cuda/wire_kernels.h
// runs it on a GPU (one kernel, the table in device memory). Segments are at most kWireSegmentMax
// elements (appendWireSegments cuts longer runs), so a kernel's blocks share the work evenly.
// Pure data and functions; thread-safe.
//
//   std::vector<WireSegment> table;
//   appendWireSegments(table, {.dense = 0, .wire = 0, .count = n, .form = WireForm::kBf16});
//   packWire(values, words, table);  // words: wireWords(table) 16-bit words
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace cohort::runtime {

enum class WireForm : uint32_t {
  kBf16 = 0,   // rounded to bf16: one word per element
  kExact = 1,  // the fp32 bits: two words per element, the low half first
};

// One run of elements in one form. Laid out for device memory as it is (24 bytes).
struct WireSegment {
  uint64_t dense = 0;  // the first element, in floats from the dense buffer's start
  uint64_t wire = 0;   // its first word, in 16-bit words from the message's start
  uint32_t count = 0;  // elements, at most kWireSegmentMax
  WireForm form = WireForm::kBf16;
};

inline constexpr uint32_t kWireSegmentMax = 4096;

// The 16-bit words `count` elements take in `form`.
inline constexpr uint64_t wireWords(WireForm form, uint64_t count) {
  return form == WireForm::kExact ? 2 * count : count;
}

// A run of any length: `run.count` may exceed kWireSegmentMax (it is a uint64_t here), appended as
// segments of at most kWireSegmentMax elements.
struct WireRun {
  uint64_t dense = 0, wire = 0, count = 0;
  WireForm form = WireForm::kBf16;
};
void appendWireSegments(std::vector<WireSegment>& table, const WireRun& run);

// wire[s.wire ...] = the elements dense[s.dense ...] of every segment, in its form (host memory).
void packWire(const float* dense, uint16_t* wire, std::span<const WireSegment> table);
// dense[s.dense ...] = the elements at wire[s.wire ...] of every segment, widened or exact.
void unpackWire(const uint16_t* wire, float* dense, std::span<const WireSegment> table);

}  // namespace cohort::runtime
