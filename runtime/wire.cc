#include "runtime/wire.h"

#include <algorithm>
#include <bit>

#include "runtime/dtype.h"

namespace cohort::runtime {

void appendWireSegments(std::vector<WireSegment>& table, const WireRun& run) {
  for (uint64_t done = 0; done < run.count;) {
    const auto count = static_cast<uint32_t>(std::min<uint64_t>(kWireSegmentMax, run.count - done));
    table.push_back({.dense = run.dense + done, .wire = run.wire + wireWords(run.form, done), .count = count,
                     .form = run.form});
    done += count;
  }
}

void packWire(const float* dense, uint16_t* wire, std::span<const WireSegment> table) {
  for (const WireSegment& s : table) {
    const float* from = dense + s.dense;
    uint16_t* to = wire + s.wire;
    for (uint32_t i = 0; i < s.count; ++i) {
      if (s.form == WireForm::kBf16) {
        to[i] = toBf16(from[i]).bits;
        continue;
      }
      const auto bits = std::bit_cast<uint32_t>(from[i]);
      to[2 * i] = static_cast<uint16_t>(bits & 0xffffu);
      to[2 * i + 1] = static_cast<uint16_t>(bits >> 16);
    }
  }
}

void unpackWire(const uint16_t* wire, float* dense, std::span<const WireSegment> table) {
  for (const WireSegment& s : table) {
    const uint16_t* from = wire + s.wire;
    float* to = dense + s.dense;
    for (uint32_t i = 0; i < s.count; ++i) {
      if (s.form == WireForm::kBf16) {
        to[i] = toFloat(Bf16{from[i]});
        continue;
      }
      to[i] = std::bit_cast<float>(static_cast<uint32_t>(from[2 * i]) | static_cast<uint32_t>(from[2 * i + 1]) << 16);
    }
  }
}

}  // namespace cohort::runtime
