// exp and tanh for CPU loops that the compiler vectorises: branch-free float code (selects, not
// branches; rounding by adding 1.5·2^23, not by a library call), so that a loop calling them per
// element becomes AVX2 code under -O3 where std::exp and std::tanh stay one libm call per element.
// The algorithms are Cephes' expf and tanhf (S. L. Moshier), written out here:
//   expVectorised(x): x = n·ln2 + r with |r| <= ln2/2 (ln2 split in two for an exact product),
//     e^r by a degree-7 polynomial, 2^n put into the exponent bits. x is clamped to [-87.3, 88.3]
//     (results from about 1.2e-38 up to 2.2e38; no infinities, no denormals).
//   tanhVectorised(x): |x| < 0.625: x + x³·P(x²) (P of degree 4); otherwise
//     sign(x)·(1 − 2/(e^{2|x|} + 1)), which has no cancellation there.
// Accuracy (tests/runtime/cpu/vector_math_test, against double precision): both within 2e-7 of the
// true value, relative (float's ulp is 6e-8 to 1.2e-7), over every range the test samples.
// Thread safety: pure functions.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace cohort::runtime::cpu {

inline float expVectorised(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.3f ? 88.3f : x;
  constexpr float kRound = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  float r = x - n * 0.693359375f;  // ln 2 = 0.693359375 − 2.12194440e-4, the first part exact in float
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const auto bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

inline float tanhVectorised(float x) {
  const float a = std::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * a + a;
  const float big = 1.0f - 2.0f / (expVectorised(2.0f * a) + 1.0f);
  return std::copysign(a < 0.625f ? small : big, x);
}

}  // namespace cohort::runtime::cpu
