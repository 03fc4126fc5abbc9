// Wire messages on the host (runtime/wire.h): appendWireSegments cuts a run at kWireSegmentMax
// elements with the words of each form counted on, and packWire / unpackWire give back a bf16
// element rounded (ties to even) and an exact element's bits (a signalling NaN's too), touching no
// element outside the segments.
#include "runtime/wire.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "runtime/dtype.h"

namespace cohort::runtime {
namespace {

TEST(Wire, LongRunsAreCutIntoSegmentsWithTheirWordsCountedOn) {
  std::vector<WireSegment> table;
  appendWireSegments(table, {.dense = 10, .wire = 3, .count = 9000, .form = WireForm::kExact});
  appendWireSegments(table, {.dense = 9010, .wire = 18003, .count = 4096, .form = WireForm::kBf16});
  appendWireSegments(table, {.dense = 0, .wire = 0, .count = 0, .form = WireForm::kBf16});
  ASSERT_EQ(table.size(), 4u);
  const uint64_t dense[] = {10, 4106, 8202, 9010}, wire[] = {3, 8195, 16387, 18003};
  const uint32_t count[] = {4096, 4096, 808, 4096};
  for (size_t s = 0; s < table.size(); ++s) {
    EXPECT_EQ(table[s].dense, dense[s]) << s;
    EXPECT_EQ(table[s].wire, wire[s]) << s;
    EXPECT_EQ(table[s].count, count[s]) << s;
  }
  EXPECT_EQ(wireWords(WireForm::kExact, 5), 10u);
  EXPECT_EQ(wireWords(WireForm::kBf16, 5), 5u);
}

TEST(Wire, Bf16ElementsArriveRoundedAndExactOnesWithTheirBits) {
  const std::vector<float> dense = {1.0f + 1.0f / 256.0f,                // a tie: rounds to even, 1
                                    1.0f + 3.0f / 256.0f,                // a tie: rounds up
                                    -0.1f,
                                    std::bit_cast<float>(0x7f800001u),  // a signalling NaN
                                    0.1f,
                                    1e-40f,
                                    7.0f};
  const std::vector<WireSegment> table = {{.dense = 0, .wire = 0, .count = 3, .form = WireForm::kBf16},
                                          {.dense = 3, .wire = 3, .count = 3, .form = WireForm::kExact}};
  std::vector<uint16_t> words(9, 0xdead);
  packWire(dense.data(), words.data(), table);
  EXPECT_EQ(words[0], 0x3f80);
  EXPECT_EQ(words[1], 0x3f82);
  EXPECT_EQ(words[2], toBf16(-0.1f).bits);
  std::vector<float> out(dense.size(), -2.0f);
  unpackWire(words.data(), out.data(), table);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(out[i], roundToBf16(dense[i])) << i;
  for (size_t i = 3; i < 6; ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(dense[i])) << i;
  }
  EXPECT_EQ(out[6], -2.0f) << "no segment names it";
}

}  // namespace
}  // namespace cohort::runtime
