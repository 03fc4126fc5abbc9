// DType: the element type of a Tensor (docs/architecture.md, "Element types").
//
// fp32 is every tensor's type unless asked otherwise: parameters, gradients, optimizer state,
// checkpoints and everything on the CPU. bf16 (bfloat16: fp32's sign and 8-bit exponent, 7 bits of
// mantissa) holds activations and the weights' copies that mixed-precision training feeds to tensor
// cores on a GPU (--precision bf16). The host helpers below convert one value at a time with the
// rounding the GPU uses (round to nearest, ties to even; NaN stays NaN), for tests and small
// transfers, not for the hot path.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

namespace cohort::runtime {

enum class DType : uint8_t { kF32, kBF16 };

inline constexpr size_t sizeOf(DType t) { return t == DType::kBF16 ? 2 : 4; }
// "fp32", "bf16": the names the command line and error messages use.
const char* dtypeName(DType t);
// Parses "fp32" or "bf16"; throws InvalidArgument naming `what` and the accepted values otherwise.
DType parseDType(const std::string& text, const std::string& what);

// One bf16 value as its bits, on the host.
struct Bf16 {
  uint16_t bits = 0;
};

inline Bf16 toBf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);  // ties to even
  return Bf16{static_cast<uint16_t>((u + rounding) >> 16)};
}

inline float toFloat(Bf16 b) { return std::bit_cast<float>(static_cast<uint32_t>(b.bits) << 16); }

// The value bf16 stores for `f`: f rounded to 8 significant bits.
inline float roundToBf16(float f) { return toFloat(toBf16(f)); }

}  // namespace cohort::runtime
