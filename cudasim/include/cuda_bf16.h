// cudasim's cuda_bf16.h: the bfloat16 type of the CUDA C++ device language and the conversions
// Cohort's kernels use, with the real header's names and rounding (to nearest, ties to even; NaN
// stays a quiet NaN). Narrower than the real type on purpose: no arithmetic operators and no
// implicit conversions, so a kernel converts where it means to (__bfloat162float, __float2bfloat16)
// and computes in fp32, which is also what the real hardware does for everything but tensor-core math.
#pragma once

#include <bit>
#include <cstdint>

#include "cuda_runtime.h"

struct alignas(2) __nv_bfloat16 {
  uint16_t __x;
};

struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40u)};
  return {static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return std::bit_cast<float>(static_cast<uint32_t>(b.__x) << 16); }

inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
inline float2 __bfloat1622float2(__nv_bfloat162 v) { return {__bfloat162float(v.x), __bfloat162float(v.y)}; }
