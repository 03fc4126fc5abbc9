// runtime/gpu_scratch.h: the device scratch sizes the memory floor counts, at shapes worked by hand.
// The bf16 attention backward's dS (64 keys × 32 queries per tile up to head size 64, 32 × 16 above;
// per head the tile pairs on or below the diagonal, packed by query tile) and cuBLASLt's workspace.
// attention_mma_backward.cu static_asserts that its tiles and packing are these.
#include "runtime/gpu_scratch.h"

#include <gtest/gtest.h>

namespace cohort::testing {
namespace {

TEST(GpuScratch, AttentionTilePairsFollowTheDiagonal) {
  // ratio 2: query tiles 0, 1 pair with key tile 0; 2, 3 with key tiles 0 and 1; ...
  EXPECT_EQ(runtime::attentionTilePairsBefore(0, 2), 0);
  EXPECT_EQ(runtime::attentionTilePairsBefore(1, 2), 1);
  EXPECT_EQ(runtime::attentionTilePairsBefore(2, 2), 2);
  EXPECT_EQ(runtime::attentionTilePairsBefore(3, 2), 4);
  EXPECT_EQ(runtime::attentionTilePairsBefore(4, 2), 6);
  EXPECT_EQ(runtime::attentionTilePairsBefore(5, 2), 9);
}

TEST(GpuScratch, Bf16AttentionScratchAtWorkedShapes) {
  // GPT-2 124M at batch 8: 32 query tiles of 32, 2·(1 + … + 16) = 272 pairs of 64·32 bf16 per head.
  EXPECT_EQ(runtime::bf16AttentionScratchBytes({.batch = 8, .heads = 12, .time = 1024, .headSize = 64}),
            size_t{8} * 12 * 272 * 64 * 32 * 2);
  EXPECT_EQ(runtime::bf16AttentionScratchBytes({.batch = 8, .heads = 12, .time = 1024, .headSize = 64}),
            size_t{102} << 20);
  // One query tile (T ≤ 32): one pair per head.
  EXPECT_EQ(runtime::bf16AttentionScratchBytes({.batch = 8, .heads = 2, .time = 16, .headSize = 16}),
            size_t{8} * 2 * 64 * 32 * 2);
  // Head size 128: 32 × 16 tiles; T = 33: 3 query tiles, pairsBefore(3) = 4 pairs.
  EXPECT_EQ(runtime::bf16AttentionScratchBytes({.batch = 2, .heads = 3, .time = 33, .headSize = 128}),
            size_t{2} * 3 * 4 * 32 * 16 * 2);
  EXPECT_EQ(runtime::bf16AttentionScratchBytes({.batch = 0, .heads = 3, .time = 33, .headSize = 128}), 0u);
}

TEST(GpuScratch, CublasLtWorkspaceBySm) {
  EXPECT_EQ(runtime::cublasLtWorkspaceBytes(9), size_t{32} << 20);
  EXPECT_EQ(runtime::cublasLtWorkspaceBytes(10), size_t{32} << 20);
  EXPECT_EQ(runtime::cublasLtWorkspaceBytes(8), size_t{4} << 20);
  EXPECT_EQ(runtime::cublasLtWorkspaceBytes(0), size_t{4} << 20);
}

}  // namespace
}  // namespace cohort::testing
