// The bf16 attention backward on tensor cores (attention_mma_backward.cu; internal to runtime/cuda/):
// one pass over the key tiles that forms dS once (FlashAttention-2's order), and a second kernel
// that turns the dS it leaves in a scratch into dQ. attentionBackward (attention_kernels.cu)
// launches both for bf16 data, after the row dot D. Conventions are attention_kernels.h's: device
// pointers on the stream's device, the launches enqueue on `stream` and check nothing more.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/cuda/attention_mma.h"

namespace cohort::runtime::cuda::attention {

// What the bf16 backward reads and writes (bf16 data as void*, like GradBuffers).
struct BackwardMmaBuffers {
  const void* qkv;
  const void* dy;
  const float* lse;     // L per row, [B, H, T]
  const float* rowDot;  // D per row, [B, H, T], already computed
  void* dqkv;           // every element written
  // runtime::bf16AttentionScratchBytes (runtime/gpu_scratch.h): dSᵀ tiles, written by the first kernel,
  // read by the second
  void* dsScratch;
};

// dq, dk and dv of the bf16 attention from qkv, dy, L and D (two kernels on `stream`).
void backwardMma(const BackwardMmaBuffers& buffers, const Geometry& g, int64_t batch, cudaStream_t stream);

}  // namespace cohort::runtime::cuda::attention
