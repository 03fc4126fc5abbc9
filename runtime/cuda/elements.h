// Element access for kernels that take fp32 or bf16 (internal to the .cu files of runtime/cuda/):
// loads widen to float, stores round once from float (to nearest, ties to even), so a kernel's
// arithmetic is fp32 whatever it reads and writes (docs/architecture.md, "Element types").
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

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

}  // namespace cohort::runtime::cuda::elements
