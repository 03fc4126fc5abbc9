#include "runtime/tensor.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "runtime/error.h"
#include "runtime/random.h"

namespace cohort::runtime {
namespace {

TEST(Shape, NumelAndString) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_THROW((Shape{1, 2, 3, 4, 5, 6, 7}), InvalidArgument);
}

TEST(Tensor, EmptyIsAlignedAndViewsShareData) {
  Tensor t = Tensor::zeros(Shape{4, 3});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % kCpuAlignment, 0u);
  Tensor rows = t.narrowRows(1, 2);
  rows.fill(7.0f);
  EXPECT_EQ(t.at(0), 0.0f);
  EXPECT_EQ(t.at(3), 7.0f);
  EXPECT_EQ(t.at(8), 7.0f);
  EXPECT_EQ(t.at(9), 0.0f);
  EXPECT_THROW(t.reshape(Shape{5}), InvalidArgument);
  EXPECT_EQ(t.reshape(Shape{12}).data(), t.data());
}

TEST(Tensor, EnsureShapeReusesStorageWhenItFits) {
  Tensor t;
  ensureShape(t, Shape{64, 10});
  float* first = t.data();
  ensureShape(t, Shape{32, 10});
  EXPECT_EQ(t.data(), first);
  EXPECT_EQ(t.shape(), (Shape{32, 10}));
  ensureShape(t, Shape{64, 10});
  EXPECT_EQ(t.data(), first);
  ensureShape(t, Shape{128, 10});
  EXPECT_EQ(t.shape(), (Shape{128, 10}));
}

TEST(Tensor, ViewOfExternalMemoryDoesNotFree) {
  float buf[6] = {1, 2, 3, 4, 5, 6};
  {
    Tensor v = Tensor::view(buf, Shape{2, 3});
    EXPECT_EQ(v.at(4), 5.0f);
    v.at(0) = 9.0f;
  }
  EXPECT_EQ(buf[0], 9.0f);
}

// bf16 tensors: two bytes per element, views and batch buffers by the element size, and data()
// refusing to read them as floats (the mistake a user's fp32 layer would make).
TEST(TensorDType, Bf16TensorsCountTwoBytesAndRefuseTheFloatAccessor) {
  Tensor t = Tensor::empty(Shape{4, 3}, cpuAllocator(), DType::kBF16);
  EXPECT_EQ(t.dtype(), DType::kBF16);
  EXPECT_EQ(t.bytes(), 24u);
  uint16_t* bits = t.data<uint16_t>();
  for (int i = 0; i < 12; ++i) bits[i] = static_cast<uint16_t>(i);
  EXPECT_EQ(t.narrowRows(2, 1).data<uint16_t>()[0], 6);
  EXPECT_DEATH(t.data(), "reads fp32, but this \\[4, 3\\] tensor holds bf16");
  EXPECT_DEATH(t.data<float>(), "4-byte T on a bf16 tensor");
  Tensor f = Tensor::zeros(Shape{12});
  EXPECT_DEATH(f.copyFrom(t), "copy of bf16 into fp32");
  Tensor c = t.clone();
  EXPECT_EQ(c.dtype(), DType::kBF16);
  EXPECT_EQ(c.data<uint16_t>()[11], 11);
}

// ensureShape reuses a buffer for another element type when it fits, and grows it when it does not.
TEST(TensorDType, EnsureShapeRetypesWithinTheCapacity) {
  Tensor t;
  ensureShape(t, Shape{8}, cpuAllocator(), DType::kF32);
  void* first = t.raw();
  ensureShape(t, Shape{16}, cpuAllocator(), DType::kBF16);
  EXPECT_EQ(t.raw(), first);
  EXPECT_EQ(t.dtype(), DType::kBF16);
  ensureShape(t, Shape{8}, cpuAllocator(), DType::kF32);
  EXPECT_EQ(t.raw(), first);
  ensureShape(t, Shape{9}, cpuAllocator(), DType::kF32);
  EXPECT_NE(t.raw(), first);
}

// The host's conversions round as the GPU does: to nearest, ties to even; NaN stays NaN; beyond
// bf16's range is infinity; widening is exact.
TEST(TensorDType, HostBf16RoundingIsNearestEven) {
  EXPECT_EQ(toBf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(toBf16(std::bit_cast<float>(0x3f808000u)).bits, 0x3f80);  // tie: stays even
  EXPECT_EQ(toBf16(std::bit_cast<float>(0x3f818000u)).bits, 0x3f82);  // tie: up to even
  EXPECT_EQ(toBf16(std::bit_cast<float>(0x3f808001u)).bits, 0x3f81);  // above the tie
  EXPECT_TRUE(std::isnan(toFloat(toBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(toFloat(toBf16(std::bit_cast<float>(0x7f800001u)))));  // not rounded into inf
  EXPECT_EQ(toFloat(toBf16(std::numeric_limits<float>::max())), std::numeric_limits<float>::infinity());
  EXPECT_EQ(toFloat(toBf16(-std::numeric_limits<float>::infinity())), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(roundToBf16(0.1f), std::bit_cast<float>(0x3dcd0000u));
  EXPECT_EQ(parseDType("bf16", "--precision"), DType::kBF16);
  EXPECT_THROW(parseDType("fp16", "--precision"), InvalidArgument);
}

TEST(Random, MatchesTheDesignDefinition) {
  // docs/data.md, "The synthetic sets, exactly": the first train element of the synthetic set
  // is (m - 2^23) / 2^24 with m from seed 1, k = 0; compute m by hand from the formula and compare.
  uint64_t z = 1ull * 0xD1B54A32D192ED03ull + 1ull * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  EXPECT_EQ(mix24(1, 0), static_cast<uint32_t>(z >> 40));
  Rng a(7), b(7, 0);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(a.nextU64(), b.nextU64());
  Rng c(7, a.counter());
  EXPECT_EQ(a.nextU64(), c.nextU64());
  for (int i = 0; i < 1000; ++i) {
    float u = a.uniform();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    ASSERT_LT(a.below(10), 10u);
  }
}

}  // namespace
}  // namespace cohort::runtime
