// CUDA kernels of nn::CausalSelfAttention's core (nn/attention.h): fused causal attention, forward
// and backward, in the manner of FlashAttention-2 (Dao, 2023), over raw device pointers, enqueued on
// an explicit stream. The T×T scores and probabilities are never stored: each block holds a tile of
// them in shared memory, and the backward recomputes them from the forward's log-sum-exp per row.
//
// The heads are read and written in place in the projections' layouts (no permutes): q, k and v of
// head h come straight from c_attn's output qkv [B, T, 3D] (q at column h·hd, k at D + h·hd, v at
// 2D + h·hd of each row), y goes to [B, T, D] (head h at columns h·hd..), and the backward reads
// dy [B, T, D] and writes dqkv [B, T, 3D]. Head sizes 1..128 (InvalidArgument above); any T ≥ 1.
//
// Conventions are kernels.h's: pointers are device memory on the stream's device, alive until the
// stream has run the kernels; qkv, y, dy and dqkv hold `type` (fp32, or bf16 in a bf16 pass: read
// widened, written rounded once; the arithmetic, L and D are fp32 either way; in bf16 every product of
// the forward and backward runs on tensor cores, P and dS rounded to bf16 for them), lse and rowDot fp32; each call enqueues its kernels on `stream` (a CUDA stream; a
// CPU stream fails a CHECK) and returns without waiting; launch errors throw cohort::Error. Results
// match the CPU code (nn/attention.cc) to float32 rounding (in fp32); tests/nn/gpu/gpu_attention_test.cc
// compares the two. No atomics: every sum runs in an order fixed by the shape alone, so the same
// inputs give the same bits on every run. Thread safety: no state; ordering is the stream's.
// Only built when CUDA is compiled in.
//
//   cuda::attentionForward({.qkv = qkv, .y = y, .lse = lse}, {.batch = B, .time = T, .heads = H, .dim = D}, stream);
//   cuda::attentionBackward({.qkv = qkv, .y = y, .lse = lse, .dy = dy, .dqkv = dqkv, .rowDot = d}, shape, stream);
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/dtype.h"
#include "runtime/stream.h"

namespace cohort::runtime::cuda {

// The attention's shape: B samples of T positions, H heads of hd = D / H features (D a multiple of H).
struct AttentionShape {
  int64_t batch = 0, time = 0, heads = 1, dim = 0;
};

// The most features per head the kernels take.
constexpr int64_t kAttentionMaxHeadSize = 128;

struct AttentionForwardBuffers {
  const void* qkv = nullptr;  // [B, T, 3D]: q, k, v side by side (c_attn's output)
  void* y = nullptr;          // [B, T, D]: every head's output side by side; not qkv
  float* lse = nullptr;       // [B, H, T]: L = m + log l per row, for attentionBackward
  DType type = DType::kF32;   // of qkv and y
};

// y = softmax(q·kᵀ/√hd with the causal mask)·v per sample and head; saves L per row.
void attentionForward(const AttentionForwardBuffers& buffers, const AttentionShape& shape, const Stream& stream);

struct AttentionBackwardBuffers {
  const void* qkv = nullptr;   // the forward's input
  const void* y = nullptr;     // the forward's output O
  const float* lse = nullptr;  // the forward's L
  const void* dy = nullptr;    // [B, T, D]
  void* dqkv = nullptr;        // [B, T, 3D]: dq, dk, dv, every element written; not an input
  float* rowDot = nullptr;     // [B, H, T] scratch: D = rowsum(dy ⊙ y) per row
  void* scratch = nullptr;     // attentionBackwardScratchBytes of device memory (16-byte aligned), or none
  DType type = DType::kF32;    // of qkv, y, dy and dqkv
};

// Bytes of AttentionBackwardBuffers::scratch: 0 for fp32; for bf16, dS of every tile pair on or below
// the diagonal, about B·H·T² bytes / 2 (102 MiB at B 8, H 12, T 1024; runtime::bf16AttentionScratchBytes,
// runtime/gpu_scratch.h). Needed only until the backward's kernels have run, so one block serves
// every layer (nn/attention.cc borrows it from GpuContext::workspace(), workspace.h).
size_t attentionBackwardScratchBytes(const AttentionShape& shape, DType type);

// dq, dk, dv of attentionForward for the upstream gradient dy (three kernels: D, then dK and dV per
// key tile (bf16: with dS to the scratch), then dQ per query tile (bf16: from that dS)).
void attentionBackward(const AttentionBackwardBuffers& buffers, const AttentionShape& shape, const Stream& stream);

}  // namespace cohort::runtime::cuda
