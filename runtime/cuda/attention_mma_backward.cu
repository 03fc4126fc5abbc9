// The bf16 attention backward on tensor cores (runtime/cuda/attention_mma_backward.h), built the way
// FlashAttention-2's is: dS is formed once, and P and dS never leave registers on their way to the
// products that use them. The forward and the fp32 kernels are attention_mma.cu's and
// attention_kernels.cu's (whose opening comment gives the algorithm and the notation).
//
// Kernel 1, the key pass: a block of kWarps warps owns a tile of kKeys = 16·kWarps keys of one
// (sample, head), 16 per warp, and holds their dK and dV (16 x kHd fp32 per warp) in registers. It
// walks the query tiles of kQueries = kKeys / 2 queries from its first key to T; per tile i, each warp
//   Sᵀ  = K·Qᵀ                         (16 keys x kQueries, mma.sync m16n8k16 into C fragments)
//   Pᵀ  = exp(Sᵀ·scale − L)            (in the C fragments; 0 where key > query; L = +∞ past T)
//   dV += Pᵀ·dO                        (Pᵀ repacked from C fragments into A fragments, bf16)
//   dPᵀ = V·dOᵀ
//   dSᵀ = Pᵀ ⊙ (dPᵀ − D)               (Pᵀ still fp32 in registers)
//   dK += dSᵀ·Q                        (dSᵀ repacked the same way)
// and stores its dSᵀ rows, bf16, to the scratch tile (i, j) (j the block's key tile). Five products
// where the two-kernel backward before it took seven. Q, dO (and their L and D) arrive by cp.async
// into the other of two buffers while the current tile is computed; K and V are loaded once and
// read by ldmatrix (A fragments), Q and dO by ldmatrix as B fragments (.trans where the product
// runs along their rows). L·log₂e and D for a tile's queries sit in shared memory, read once per
// fragment column. Finally dK · scale and dV go out.
//
// Kernel 2, the query pass: dQ_i = scale · Σ_j dS_ij·K_j, one block of kQueries / 16 warps per query
// tile i (the last tiles first), walking key tiles j = 0..i / kRatio in order, the scratch's dSᵀ tile
// and K_j double-buffered by cp.async, both read by ldmatrix.trans.
//
// Why a scratch: dQ sums over key tiles, which the key pass spreads over blocks. FlashAttention-2
// adds each block's share with fp32 atomics, whose order varies run to run; Cohort's results are
// bitwise reproducible, so the shares must be summed in a fixed order. Of the ways to do that, bf16
// dS (the very values dK's product uses) is the smallest thing to keep: a per-key-tile fp32 dQ
// partial would take 4·hd bytes per query and key tile where dS takes 2·kKeys, and recomputing S and
// dP in a dQ kernel is the seven-product design this replaces. The scratch holds only the tile pairs
// on or below the diagonal, packed by query tile (pairsBefore): B·H·Σ_i (i / kRatio + 1) tiles of
// kKeys·kQueries bf16, about B·H·T² bytes / 2 — 102 MiB at GPT-2 124M (B 8, H 12, T 1024, hd 64). It
// lives only during one layer's backward (nn/attention.cc borrows it from the GpuContext's workspace,
// workspace.h: one block for every layer and step).
//
// Tiles per head-size bucket: hd ≤ 64: 4 warps, 64 keys, 32-query tiles (shared memory 36.9 KiB at
// kHd 64, dQ pass 28.4 KiB); kHd 128: 2 warps, 32 keys, 16-query tiles, so that the 128 fp32
// accumulators per thread of dK and dV leave room (34.8 KiB; dQ pass 20.0 KiB). Shared rows are
// padded by 16 bytes, so the 8 rows one ldmatrix reads fall in different banks.
//
// Sums run in a fixed order (query tiles in order for dK and dV, key tiles in order for dQ, k in
// order within each mma): the same inputs give the same bits on every run. No atomics.
#include "runtime/cuda/attention_mma_backward.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "runtime/cuda/launch.h"
#include "runtime/cuda/warp_mma.h"
#include "runtime/error.h"
#include "runtime/gpu_scratch.h"

namespace cohort::runtime::cuda::attention {
namespace {

// Loops over fragment arrays are unrolled, so that the arrays stay in registers (nvcc only: g++
// compiles the emulated device's kernels and knows no such pragma).
#ifdef COHORT_CUDASIM
#define COHORT_FRAGMENT_LOOP
#else
#define COHORT_FRAGMENT_LOOP _Pragma("unroll")
#endif

using Bf16 = __nv_bfloat16;
using launch::kWarpSize;

constexpr float kLog2e = 1.4426950408889634f;

template <int kHdBucket>
struct BackwardTiles {
  static constexpr int kHd = kHdBucket;
  static constexpr int kWarps = kHd > 64 ? 2 : 4;         // of the key pass
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kKeys = 16 * kWarps;                // keys per key-pass block
  static constexpr int kQueries = kKeys / 2;               // queries per walked tile and per dQ block
  static constexpr int kRatio = kKeys / kQueries;          // query tiles per key tile
  static constexpr int kQueryThreads = kQueries / 16 * kWarpSize;  // of the query pass
  static constexpr int kLd = kHd + 8;                      // bf16 row stride of Q, K, V and dO tiles
  static constexpr int kDsLd = kQueries + 8;               // of a dSᵀ tile in shared memory
  static constexpr int kSteps = kHd / 16;                  // k-steps along a head's columns
  static constexpr int kN = kQueries / 8;                  // n-tiles of a warp's 16 x kQueries scores
  static constexpr int kOut = kHd / 8;                     // n-tiles of a warp's 16 x kHd gradient
  static constexpr int kTileElements = kKeys * kQueries;   // of one dSᵀ tile in the scratch
};

// The dSᵀ tiles of one head stored before query tile i's: tile i' pairs with key tiles 0..i' / kRatio.
template <class M>
__host__ __device__ constexpr int64_t pairsBefore(int64_t i) {
  const int64_t a = i / M::kRatio, b = i % M::kRatio;
  return M::kRatio * a * (a + 1) / 2 + b * (a + 1);
}

// The scratch's size comes from runtime/gpu_scratch.h (so that the memory floor counts it in every
// build): its tiles and packing must be these.
template <class M>
constexpr bool scratchLayoutAgrees() {
  const AttentionBackwardTiles t = attentionBackwardTiles(M::kHd);
  if (t.keys != M::kKeys || t.queries != M::kQueries) return false;
  for (int64_t i = 0; i < 64; ++i) {
    if (attentionTilePairsBefore(i, M::kRatio) != pairsBefore<M>(i)) return false;
  }
  return true;
}
static_assert(scratchLayoutAgrees<BackwardTiles<32>>() && scratchLayoutAgrees<BackwardTiles<64>>() &&
              scratchLayoutAgrees<BackwardTiles<128>>());

struct BackwardArgs {
  const Bf16* qkv;
  const Bf16* dy;
  const float* lse;
  const float* rowDot;
  Bf16* dqkv;
  Bf16* ds;          // the scratch
  bool vectorLoads;  // hd and D multiples of 8 and 16-byte aligned bases: 16-byte cp.async for the rows
};

// One (sample, head) as the kernels see it: q, k, v and dO at their first row, rows `stride` and
// `dyStride` elements apart; L and D at the head's first position.
struct Head {
  const Bf16 *q, *k, *v, *dO;
  int64_t stride, dyStride;
  const float *lse, *rowDot;
};

__device__ Head headOf(const BackwardArgs& args, const Geometry& g, int bh) {
  const int64_t stride = 3 * static_cast<int64_t>(g.dim), sampleRow = static_cast<int64_t>(bh / g.heads) * g.time;
  const int column = bh % g.heads * g.headSize;
  const Bf16* q = args.qkv + sampleRow * stride + column;
  return {.q = q,
          .k = q + g.dim,
          .v = q + 2 * g.dim,
          .dO = args.dy + sampleRow * g.dim + column,
          .stride = stride,
          .dyStride = g.dim,
          .lse = args.lse + static_cast<int64_t>(bh) * g.time,
          .rowDot = args.rowDot + static_cast<int64_t>(bh) * g.time};
}

// Rows first.. of a matrix (rows `rowStride` apart from `head`) into the kRows x kCols tile, zeros
// from row `rows` and column `cols` on: 16-byte cp.async where `vector` (then cols is a multiple of
// 8), else plain loads. Every thread of the block's kThreads takes part.
template <int kRows, int kCols, int kLd, int kThreads>
__device__ void loadTile(Bf16 (*tile)[kLd], const Bf16* head, int64_t rowStride, int first, int rows, int cols,
                         bool vector) {
  if (vector) {
    constexpr int kChunks = kCols / 8;
    for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
      const int r = c / kChunks, d = c % kChunks * 8, t = first + r;
      const bool valid = t < rows && d < cols;
      ptx::cpAsync16(&tile[r][d], valid ? head + t * rowStride + d : head, valid);
    }
  } else {
    for (int i = threadIdx.x; i < kRows * kCols; i += kThreads) {
      const int r = i / kCols, d = i % kCols, t = first + r;
      tile[r][d] = t < rows && d < cols ? head[t * rowStride + d] : __float2bfloat16_rn(0.0f);
    }
  }
}

// This lane's row address for an x4 ldmatrix of the 16 x 16 block at (row0, col0) of a row-major
// tile, the four 8 x 8 matrices in the order (+0, +0), (+8, +0), (+0, +8), (+8, +8): A's fragment
// (plain), or two n-tiles' B fragments from a tile stored [k][n] (.trans).
template <int kLd>
__device__ const Bf16* fragmentOrder(const Bf16 (*tile)[kLd], int row0, int col0) {
  const int lane = threadIdx.x % kWarpSize;
  return &tile[row0 + lane % 8 + lane / 8 % 2 * 8][col0 + lane / 16 * 8];
}

// ... in the order (+0, +0), (+0, +8), (+8, +0), (+8, +8): two n-tiles' B fragments from a tile
// stored [n][k] (plain), or A's fragment from a tile stored [k][m] (.trans).
template <int kLd>
__device__ const Bf16* pairOrder(const Bf16 (*tile)[kLd], int row0, int col0) {
  const int lane = threadIdx.x % kWarpSize;
  return &tile[row0 + lane % 8 + lane / 16 * 8][col0 + lane / 8 % 2 * 8];
}

// c[n] = A·Bᵀ for the warp's 16 rows: A rows row0.. of aTile, B the kN·8 rows of bTile (n-tile n
// its rows 8n..), both along all kHd columns: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ.
template <class M>
__device__ void productWithRows(float (&c)[M::kN][4], const Bf16 (*aTile)[M::kLd], int row0,
                                const Bf16 (*bTile)[M::kLd]) {
  COHORT_FRAGMENT_LOOP
  for (int n = 0; n < M::kN; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
  COHORT_FRAGMENT_LOOP
  for (int s = 0; s < M::kSteps; ++s) {
    uint32_t a[4];
    ptx::ldmatrixX4(a, fragmentOrder(aTile, row0, s * 16));
    COHORT_FRAGMENT_LOOP
    for (int n = 0; n < M::kN; n += 2) {
      uint32_t b[4];
      ptx::ldmatrixX4(b, pairOrder(bTile, n * 8, s * 16));
      const uint32_t low[2] = {b[0], b[1]}, high[2] = {b[2], b[3]};
      ptx::mma16816(c[n], a, low, c[n]);
      ptx::mma16816(c[n + 1], a, high, c[n + 1]);
    }
  }
}

// acc[n] += A·B for one k-step: A the warp's 16 x 16 fragment, B rows k0..k0 + 15 of bTile (stored
// [k][n], all kHd columns).
template <class M, int kLd>
__device__ void accumulateStep(float (&acc)[M::kOut][4], const uint32_t (&a)[4], const Bf16 (*bTile)[kLd], int k0) {
  COHORT_FRAGMENT_LOOP
  for (int n = 0; n < M::kOut; n += 2) {
    uint32_t b[4];
    ptx::ldmatrixX4Trans(b, fragmentOrder(bTile, k0, n * 8));
    const uint32_t low[2] = {b[0], b[1]}, high[2] = {b[2], b[3]};
    ptx::mma16816(acc[n], a, low, acc[n]);
    ptx::mma16816(acc[n + 1], a, high, acc[n + 1]);
  }
}

// C fragments of a 16 x kQueries product (n-tiles 2s and 2s + 1) as the A fragment of k-step s,
// rounded to bf16: the C and A layouts agree on which lane holds which element, so no exchange.
template <class M>
__device__ void toOperand(uint32_t (&a)[M::kN / 2][4], const float (&c)[M::kN][4]) {
  COHORT_FRAGMENT_LOOP
  for (int s = 0; s < M::kN / 2; ++s) {
    a[s][0] = ptx::packBf16x2(c[2 * s][0], c[2 * s][1]);
    a[s][1] = ptx::packBf16x2(c[2 * s][2], c[2 * s][3]);
    a[s][2] = ptx::packBf16x2(c[2 * s + 1][0], c[2 * s + 1][1]);
    a[s][3] = ptx::packBf16x2(c[2 * s + 1][2], c[2 * s + 1][3]);
  }
}

// The warp's 16 rows of dSᵀ (A fragments) into its rows row0.. of a scratch tile [kKeys][kQueries].
template <class M>
__device__ void storeDs(const uint32_t (&a)[M::kN / 2][4], Bf16* tile, int row0) {
  const int lane = threadIdx.x % kWarpSize, tid = lane % 4;
  auto* upper = reinterpret_cast<uint32_t*>(tile + (row0 + lane / 4) * M::kQueries);
  uint32_t* lower = upper + 8 * M::kQueries / 2;
  COHORT_FRAGMENT_LOOP
  for (int s = 0; s < M::kN / 2; ++s) {
    upper[8 * s + tid] = a[s][0];
    lower[8 * s + tid] = a[s][1];
    upper[8 * s + 4 + tid] = a[s][2];
    lower[8 * s + 4 + tid] = a[s][3];
  }
}

// A warp's 16 x kHd fragments times `scale`, rounded to bf16, to rows row0 + groupID (+ 8) of `out`
// (rows `rowStride` apart), where the row is under `rows` and the column under `cols`.
template <class M>
__device__ void storeRows(const float (&acc)[M::kOut][4], Bf16* out, int64_t rowStride, int row0, int rows, int cols,
                          float scale) {
  const int lane = threadIdx.x % kWarpSize;
  COHORT_FRAGMENT_LOOP
  for (int n = 0; n < M::kOut; ++n) {
    COHORT_FRAGMENT_LOOP
    for (int e = 0; e < 4; ++e) {
      const int r = row0 + lane / 4 + e / 2 * 8, d = n * 8 + lane % 4 * 2 + e % 2;
      if (r < rows && d < cols) out[r * rowStride + d] = __float2bfloat16_rn(acc[n][e] * scale);
    }
  }
}

// A query tile's buffers in the key pass: Q and dO rows, L·log₂e (+∞ past T) and D (0 past T).
template <class M>
struct QueryTile {
  Bf16 q[M::kQueries][M::kLd];
  Bf16 dO[M::kQueries][M::kLd];
  float lse[M::kQueries];
  float rowDot[M::kQueries];
};

// Query tile i into `tile`: the rows by loadTile, L and D by plain loads (a row's 4 bytes).
template <class M>
__device__ void loadQueryTile(QueryTile<M>& tile, const Head& head, const Geometry& g, int i, bool vector) {
  const int first = i * M::kQueries;
  loadTile<M::kQueries, M::kHd, M::kLd, M::kThreads>(tile.q, head.q, head.stride, first, g.time, g.headSize, vector);
  loadTile<M::kQueries, M::kHd, M::kLd, M::kThreads>(tile.dO, head.dO, head.dyStride, first, g.time, g.headSize,
                                                       vector);
  if (threadIdx.x < M::kQueries) {
    const int t = first + threadIdx.x;
    tile.lse[threadIdx.x] = t < g.time ? head.lse[t] * kLog2e : INFINITY;
    tile.rowDot[threadIdx.x] = t < g.time ? head.rowDot[t] : 0.0f;
  }
}

// One query tile of the key pass for the warp's 16 keys (rows warpRow.. of kTile and vTile; the
// block's first key keyFirst): dV and dK accumulate, dSᵀ goes to the scratch tile `ds`.
template <class M>
__device__ void keyPassTile(const Bf16 (*kTile)[M::kLd], const Bf16 (*vTile)[M::kLd], const QueryTile<M>& tile,
                            int warpRow, int keyFirst, int queryFirst, float scaleLog2, float (&dk)[M::kOut][4],
                            float (&dv)[M::kOut][4], Bf16* ds) {
  const int lane = threadIdx.x % kWarpSize, key = keyFirst + warpRow + lane / 4;
  const bool diagonal = queryFirst < keyFirst + warpRow + 16;  // some key of the warp after some query
  float p[M::kN][4], dp[M::kN][4];
  uint32_t operand[M::kN / 2][4];
  productWithRows<M>(p, kTile, warpRow, tile.q);  // Sᵀ = K·Qᵀ
  COHORT_FRAGMENT_LOOP
  for (int n = 0; n < M::kN; ++n) {
    COHORT_FRAGMENT_LOOP
    for (int e = 0; e < 4; ++e) {
      const int column = n * 8 + lane % 4 * 2 + e % 2;
      p[n][e] = exp2f(fmaf(p[n][e], scaleLog2, -tile.lse[column]));  // Pᵀ = 2^((S·scale − L)·log₂e)
      if (diagonal && key + e / 2 * 8 > queryFirst + column) p[n][e] = 0.0f;
    }
  }
  toOperand<M>(operand, p);
  COHORT_FRAGMENT_LOOP
  for (int s = 0; s < M::kN / 2; ++s) accumulateStep<M>(dv, operand[s], tile.dO, s * 16);  // dV += Pᵀ·dO
  productWithRows<M>(dp, vTile, warpRow, tile.dO);                                         // dPᵀ = V·dOᵀ
  COHORT_FRAGMENT_LOOP
  for (int n = 0; n < M::kN; ++n) {
    COHORT_FRAGMENT_LOOP
    for (int e = 0; e < 4; ++e) dp[n][e] = p[n][e] * (dp[n][e] - tile.rowDot[n * 8 + lane % 4 * 2 + e % 2]);  // dSᵀ
  }
  toOperand<M>(operand, dp);
  COHORT_FRAGMENT_LOOP
  for (int s = 0; s < M::kN / 2; ++s) accumulateStep<M>(dk, operand[s], tile.q, s * 16);  // dK += dSᵀ·Q
  storeDs<M>(operand, ds, warpRow);
}

template <int kHd>
__global__ void __launch_bounds__(BackwardTiles<kHd>::kThreads)
    attentionKeyPassMmaKernel(BackwardArgs args, Geometry g) {
  using M = BackwardTiles<kHd>;
  alignas(16) __shared__ Bf16 kTile[M::kKeys][M::kLd];
  alignas(16) __shared__ Bf16 vTile[M::kKeys][M::kLd];
  alignas(16) __shared__ QueryTile<M> tiles[2];
  const int warpRow = threadIdx.x / kWarpSize * 16, keyFirst = blockIdx.y * M::kKeys;
  const Head head = headOf(args, g, blockIdx.x);
  const int queryTiles = (g.time + M::kQueries - 1) / M::kQueries, firstTile = blockIdx.y * M::kRatio;
  Bf16* ds = args.ds + static_cast<int64_t>(blockIdx.x) * pairsBefore<M>(queryTiles) * M::kTileElements;
  loadTile<M::kKeys, kHd, M::kLd, M::kThreads>(kTile, head.k, head.stride, keyFirst, g.time, g.headSize,
                                               args.vectorLoads);
  loadTile<M::kKeys, kHd, M::kLd, M::kThreads>(vTile, head.v, head.stride, keyFirst, g.time, g.headSize,
                                               args.vectorLoads);
  loadQueryTile<M>(tiles[0], head, g, firstTile, args.vectorLoads);
  ptx::cpAsyncCommit();
  float dk[M::kOut][4] = {}, dv[M::kOut][4] = {};
  for (int i = firstTile; i < queryTiles; ++i) {
    const int buffer = (i - firstTile) % 2;
    if (i + 1 < queryTiles) loadQueryTile<M>(tiles[1 - buffer], head, g, i + 1, args.vectorLoads);
    ptx::cpAsyncCommit();
    ptx::cpAsyncWait<1>();  // tile i (and K, V) landed; tile i + 1 may be in flight
    __syncthreads();
    keyPassTile<M>(kTile, vTile, tiles[buffer], warpRow, keyFirst, i * M::kQueries, g.scale * kLog2e, dk, dv,
                   ds + (pairsBefore<M>(i) + blockIdx.y) * M::kTileElements);
    __syncthreads();  // tile i read before tile i + 2 lands over it
  }
  Bf16* dqkv = args.dqkv + (head.q - args.qkv);
  storeRows<M>(dk, dqkv + g.dim, head.stride, keyFirst + warpRow, g.time, g.headSize, g.scale);
  storeRows<M>(dv, dqkv + 2 * g.dim, head.stride, keyFirst + warpRow, g.time, g.headSize, 1.0f);
}

// The query pass's buffers for one key tile: its dSᵀ tile (from the scratch) and K rows.
template <class M>
struct KeyTile {
  Bf16 ds[M::kKeys][M::kDsLd];
  Bf16 k[M::kKeys][M::kLd];
};

template <class M>
__device__ void loadKeyTile(KeyTile<M>& tile, const Bf16* ds, const Head& head, const Geometry& g, int j,
                            bool vector) {
  loadTile<M::kKeys, M::kQueries, M::kDsLd, M::kQueryThreads>(tile.ds, ds, M::kQueries, 0, M::kKeys, M::kQueries,
                                                               true);
  loadTile<M::kKeys, M::kHd, M::kLd, M::kQueryThreads>(tile.k, head.k, head.stride, j * M::kKeys, g.time,
                                                        g.headSize, vector);
}

template <int kHd>
__global__ void __launch_bounds__(BackwardTiles<kHd>::kQueryThreads)
    attentionQueryPassMmaKernel(BackwardArgs args, Geometry g) {
  using M = BackwardTiles<kHd>;
  alignas(16) __shared__ KeyTile<M> tiles[2];
  const int warpRow = threadIdx.x / kWarpSize * 16;
  const Head head = headOf(args, g, blockIdx.x);
  const int queryTiles = (g.time + M::kQueries - 1) / M::kQueries, i = queryTiles - 1 - blockIdx.y;
  const int keyTiles = i / M::kRatio + 1;
  const Bf16* ds = args.ds + (blockIdx.x * pairsBefore<M>(queryTiles) + pairsBefore<M>(i)) * M::kTileElements;
  loadKeyTile<M>(tiles[0], ds, head, g, 0, args.vectorLoads);
  ptx::cpAsyncCommit();
  float dq[M::kOut][4] = {};
  for (int j = 0; j < keyTiles; ++j) {
    const KeyTile<M>& tile = tiles[j % 2];
    if (j + 1 < keyTiles) loadKeyTile<M>(tiles[1 - j % 2], ds + (j + 1) * M::kTileElements, head, g, j + 1,
                                         args.vectorLoads);
    ptx::cpAsyncCommit();
    ptx::cpAsyncWait<1>();
    __syncthreads();
    COHORT_FRAGMENT_LOOP
    for (int s = 0; s < M::kKeys / 16; ++s) {  // dQ += dS·K, dS read transposed from dSᵀ
      uint32_t a[4];
      ptx::ldmatrixX4Trans(a, pairOrder(tile.ds, s * 16, warpRow));
      accumulateStep<M>(dq, a, tile.k, s * 16);
    }
    __syncthreads();  // tile j read before tile j + 2 lands over it
  }
  storeRows<M>(dq, args.dqkv + (head.q - args.qkv), head.stride, i * M::kQueries + warpRow, g.time, g.headSize,
               g.scale);
}

}  // namespace

void backwardMma(const BackwardMmaBuffers& b, const Geometry& g, int64_t batch, cudaStream_t stream) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  COHORT_CHECK(aligned(b.dsScratch)) << "attention backward: scratch at " << b.dsScratch << " is not 16-byte aligned";
  const BackwardArgs args{.qkv = static_cast<const Bf16*>(b.qkv),
                          .dy = static_cast<const Bf16*>(b.dy),
                          .lse = b.lse,
                          .rowDot = b.rowDot,
                          .dqkv = static_cast<Bf16*>(b.dqkv),
                          .ds = static_cast<Bf16*>(b.dsScratch),
                          .vectorLoads = g.headSize % 8 == 0 && g.dim % 8 == 0 && aligned(b.qkv) && aligned(b.dy)};
  forBucket(g.headSize, [&](auto bucket) {
    constexpr int kHd = decltype(bucket)::value;
    using M = BackwardTiles<kHd>;
    const auto heads = static_cast<unsigned>(batch * g.heads);
    const dim3 keyGrid(heads, static_cast<unsigned>((g.time + M::kKeys - 1) / M::kKeys));
    const dim3 queryGrid(heads, static_cast<unsigned>((g.time + M::kQueries - 1) / M::kQueries));
    COHORT_LAUNCH((attentionKeyPassMmaKernel<kHd>), keyGrid, M::kThreads, 0, stream)(args, g);
    COHORT_LAUNCH((attentionQueryPassMmaKernel<kHd>), queryGrid, M::kQueryThreads, 0, stream)(args, g);
  });
}

}  // namespace cohort::runtime::cuda::attention
