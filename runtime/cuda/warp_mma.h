// The warp-level PTX instructions the bf16 attention kernels are built on (internal to
// runtime/cuda/'s .cu files): mma.sync m16n8k16 with bf16 inputs and fp32 accumulation, ldmatrix,
// and cp.async with its groups. Under nvcc each is inline PTX; on the emulated device (cudasim) each
// is cudasim/include/cudasim/ptx.h's exact emulation, which also checks what the hardware needs.
//
// Fragment layouts (the PTX ISA's), with groupID = lane / 4 and tid = lane % 4; a uint32_t holds two
// bf16, the lower column (or k) in its low half:
//   A (16x16, row-major): a[0] (groupID, 2tid..+1), a[1] (groupID+8, 2tid..+1), a[2] (groupID,
//     2tid+8..+9), a[3] (groupID+8, 2tid+8..+9);
//   B (16x8, element (k, n)): b[0] (k = 2tid..+1, n = groupID), b[1] (k = 2tid+8..+9, n = groupID);
//   C and D (16x8 fp32): c[0], c[1] (groupID, 2tid..+1), c[2], c[3] (groupID+8, 2tid..+1).
// ldmatrix: lanes 8i..8i+7 give the 8 row addresses (16-byte aligned, shared memory) of matrix i;
// r[i] gets this lane's pair of matrix i (row lane/4, columns 2(lane%4)..+1; .trans: the same of
// the transposed matrix). So ldmatrixX4 of a 16x16 row-major tile whose lanes give rows
// (lane % 16) at column 8(lane / 16) yields A's fragment, and an X2 over a tile stored [n][k] B's.
//
// Every mma and ldmatrix is warp-collective (all 32 lanes, converged). A cp.async copy is visible
// to its thread only after the cpAsyncWait that covers its group, and to the block's other threads
// only after a __syncthreads that follows that wait.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#ifdef COHORT_CUDASIM
#include "cudasim/ptx.h"
#endif

namespace cohort::runtime::cuda::ptx {

// D = A·B + C (mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32); D may be C.
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                         const float (&c)[4]) {
#ifdef COHORT_CUDASIM
  ::cudasim::ptx::mma16816(d, a, b, c);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#endif
}

#ifndef COHORT_CUDASIM
__device__ __forceinline__ uint32_t sharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// ldmatrix.sync.aligned.m8n8.x4.shared.b16
__device__ __forceinline__ void ldmatrixX4(uint32_t (&r)[4], const void* rowAddress) {
#ifdef COHORT_CUDASIM
  ::cudasim::ptx::ldmatrix(r, 4, false, rowAddress);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sharedAddress(rowAddress))
               : "memory");
#endif
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16
__device__ __forceinline__ void ldmatrixX4Trans(uint32_t (&r)[4], const void* rowAddress) {
#ifdef COHORT_CUDASIM
  ::cudasim::ptx::ldmatrix(r, 4, true, rowAddress);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(sharedAddress(rowAddress))
               : "memory");
#endif
}

// ldmatrix.sync.aligned.m8n8.x2.shared.b16 (the row addresses of lanes 0..15)
__device__ __forceinline__ void ldmatrixX2(uint32_t (&r)[2], const void* rowAddress) {
#ifdef COHORT_CUDASIM
  ::cudasim::ptx::ldmatrix(r, 2, false, rowAddress);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(sharedAddress(rowAddress))
               : "memory");
#endif
}

// ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16
__device__ __forceinline__ void ldmatrixX2Trans(uint32_t (&r)[2], const void* rowAddress) {
#ifdef COHORT_CUDASIM
  ::cudasim::ptx::ldmatrix(r, 2, true, rowAddress);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(sharedAddress(rowAddress))
               : "memory");
#endif
}

// cp.async.cg.shared.global of 16 bytes (both addresses 16-byte aligned); !valid: 16 zero bytes
// (src-size 0, nothing read, though `global` must still be a mapped, aligned address).
__device__ __forceinline__ void cpAsync16(void* shared, const void* global, bool valid) {
#ifdef COHORT_CUDASIM
  ::cudasim::ptx::cpAsync16(shared, global, valid);
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sharedAddress(shared)), "l"(global),
               "r"(valid ? 16 : 0)
               : "memory");
#endif
}

// cp.async.commit_group: the copies issued since the last commit form one group.
__device__ __forceinline__ void cpAsyncCommit() {
#ifdef COHORT_CUDASIM
  ::cudasim::ptx::cpAsyncCommit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// cp.async.wait_group kPending: every group but the newest kPending has landed.
template <int kPending>
__device__ __forceinline__ void cpAsyncWait() {
#ifdef COHORT_CUDASIM
  ::cudasim::ptx::cpAsyncWait(kPending);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Two floats rounded to bf16 (to nearest, ties to even), `low` in the low half: a fragment register.
__device__ __forceinline__ uint32_t packBf16x2(float low, float high) {
#ifdef COHORT_CUDASIM
  return static_cast<uint32_t>(__float2bfloat16_rn(low).__x) | static_cast<uint32_t>(__float2bfloat16_rn(high).__x)
                                                                    << 16;
#else
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(high), "f"(low));
  return packed;
#endif
}

}  // namespace cohort::runtime::cuda::ptx
