// Element access for kernels that take fp32 or bf16 (internal to the .cu files of runtime/cuda/):
// loads widen to float, stores round once from float (to nearest, ties to even), so a kernel's
// arithmetic is fp32 whatever it reads and writes (docs/architecture.md, "Element types").
//
//   dispatch(type, [&](auto tag) { using T = typename decltype(tag)::type; launch<T>(...); });
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "runtime/dtype.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda::elements {

__device__ __forceinline__ float load(float v) { return v; }
__device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T store(float v);
template <>
__device__ __forceinline__ float store<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 store<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Four consecutive elements moved as one access (16 bytes of fp32, 8 of bf16): quad i of p is
// elements 4i..4i+3, and p must be aligned to the access (quadAligned).
struct alignas(8) Bf16Quad {
  __nv_bfloat162 lo, hi;
};

__device__ __forceinline__ float4 loadQuad(const float* p, size_t i) { return reinterpret_cast<const float4*>(p)[i]; }
__device__ __forceinline__ float4 loadQuad(const __nv_bfloat16* p, size_t i) {
  const Bf16Quad q = reinterpret_cast<const Bf16Quad*>(p)[i];
  const float2 lo = __bfloat1622float2(q.lo), hi = __bfloat1622float2(q.hi);
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ void storeQuad(float* p, size_t i, float4 v) { reinterpret_cast<float4*>(p)[i] = v; }
__device__ __forceinline__ void storeQuad(__nv_bfloat16* p, size_t i, float4 v) {
  reinterpret_cast<Bf16Quad*>(p)[i] = {__floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w)};
}

// Eight consecutive bf16 elements moved as one 16-byte access (p aligned to 16 bytes).
struct alignas(16) Bf16Eight {
  __nv_bfloat162 pair[4];
};

// Whether p may be read or written by quads of `type` (4 · its size in bytes).
inline bool quadAligned(const void* p, DType type) {
  return reinterpret_cast<uintptr_t>(p) % (4 * static_cast<uintptr_t>(sizeOf(type))) == 0;
}

// How many leading quads of `count` elements a kernel may move four at a time: count / 4 when every
// buffer is aligned to its quads, else 0 (every element one by one).
inline size_t quadsFor(size_t count, std::initializer_list<std::pair<const void*, DType>> buffers) {
  for (const auto& [p, type] : buffers) {
    if (!quadAligned(p, type)) return 0;
  }
  return count / 4;
}

// The C++ type a DType is stored as on the device, as a tag: TypeTag<T>::type.
template <class T>
struct TypeTag {
  using type = T;
};

// The DType a device type stores.
template <class T>
constexpr DType dtypeOf();
template <>
constexpr DType dtypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType dtypeOf<__nv_bfloat16>() {
  return DType::kBF16;
}

// f(TypeTag<float>{}) or f(TypeTag<__nv_bfloat16>{}) for `type` (host code: picks a kernel).
template <class F>
void dispatch(DType type, F&& f) {
  switch (type) {
    case DType::kF32:
      f(TypeTag<float>{});
      return;
    case DType::kBF16:
      f(TypeTag<__nv_bfloat16>{});
      return;
  }
  COHORT_CHECK(false) << "no kernel for element type " << static_cast<int>(type);
}

}  // namespace cohort::runtime::cuda::elements
