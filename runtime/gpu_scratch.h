// Device scratch that the GPU path holds besides its tensors, as plain arithmetic that every build
// has (no CUDA), so that host-side estimates (`cohort train`'s memory floor, cli/memory_estimate.h)
// count what the kernels will take: the bf16 attention backward's dS scratch
// (runtime/cuda/attention_mma_backward.cu, whose tiles and packing static_assert these figures; one
// block for all layers, runtime/cuda/workspace.h) and cuBLASLt's workspace (runtime/cuda/blas_lt.cc,
// one per Blas). Pure functions; thread-safe.
//
//   size_t ds = runtime::bf16AttentionScratchBytes({.batch = 8, .heads = 12, .time = 1024, .headSize = 64});
#pragma once

#include <cstddef>
#include <cstdint>

namespace cohort::runtime {

// The bf16 backward's tiles for a head size: up to 64, 64 keys by 32 queries; above, 32 by 16.
struct AttentionBackwardTiles {
  int64_t keys = 0;
  int64_t queries = 0;
};
constexpr AttentionBackwardTiles attentionBackwardTiles(int64_t headSize) {
  return headSize <= 64 ? AttentionBackwardTiles{64, 32} : AttentionBackwardTiles{32, 16};
}

// The dSᵀ tiles one head stores before query tile i's (tile i' pairs with key tiles 0..i' / ratio,
// ratio = keys / queries): the packing of attention_mma_backward.cu's pairsBefore.
constexpr int64_t attentionTilePairsBefore(int64_t i, int64_t ratio) {
  const int64_t a = i / ratio, b = i % ratio;
  return ratio * a * (a + 1) / 2 + b * (a + 1);
}

struct AttentionScratchShape {
  int64_t batch = 0, heads = 0, time = 0, headSize = 0;
};

// Bytes of the bf16 dS scratch (bf16 dSᵀ of every tile pair on or below the diagonal, per head):
// about batch·heads·time² bytes / 2; 102 MiB at GPT-2 124M's batch 8 (12 heads, T 1024, hd 64).
constexpr size_t bf16AttentionScratchBytes(const AttentionScratchShape& s) {
  const AttentionBackwardTiles t = attentionBackwardTiles(s.headSize);
  const int64_t queryTiles = (s.time + t.queries - 1) / t.queries;
  const int64_t pairs = attentionTilePairsBefore(queryTiles, t.keys / t.queries);
  return static_cast<size_t>(s.batch * s.heads * pairs * t.keys * t.queries) * 2;
}

// cuBLASLt's workspace on a device of compute capability `major`.x: 32 MiB on sm_90 and later (what
// NVIDIA recommends for Hopper, and llm.c's), 4 MiB before.
constexpr size_t cublasLtWorkspaceBytes(int major) { return major >= 9 ? size_t{32} << 20 : size_t{4} << 20; }

}  // namespace cohort::runtime
