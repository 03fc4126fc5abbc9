// Fused causal attention on tensor cores for bf16 data (runtime/cuda/attention_mma.h): the forward,
// dQ, and dK with dV, with the warp matrix functions (wmma, m16n16k16, bf16 inputs, fp32
// accumulation). The fp32 kernels (CUDA cores) are attention_kernels.cu's, whose opening comment
// gives the algorithm.
#include "runtime/cuda/attention_mma.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

#include "runtime/cuda/launch.h"

namespace cohort::runtime::cuda::attention {
namespace {

using namespace launch;  // kWarpSize, kFullMask, MaxOp (launch.h)

// Every kernel here runs blocks of 4 warps that own kRows = 64 rows, 16 per warp (queries in the
// forward and dQ, keys in dK and dV), and walk tiles of kStep rows of the other side.
//
// The bf16 forward: a block of 64 queries walks the key tiles of kStep keys up to its last query. Per tile, each warp computes its S = Q·Kᵀ (16 x kStep) into fragments and stores it to
// its scratch rows; two lanes per row apply the scale and the causal mask, update the row's running
// max and sum (fp32, from the unrounded p) and write p rounded to bf16; O (16 x kHd, in fragments)
// is rescaled by the row's alpha through the same scratch (skipped where no row's max moved) and
// gets P·V. Fragments hold their elements in an order CUDA leaves unspecified, so every per-row step
// goes through shared memory. Shared memory per block (kHd 32 / 64 / 128): 36.9 / 45.0 / 40.4 KiB.
template <int kHdBucket, int kStepRows = (kHdBucket > 64 ? 32 : 64)>
struct MmaTiles {
  static constexpr int kHd = kHdBucket;
  static constexpr int kWarps = 4, kThreads = kWarps * kWarpSize, kRows = kWarps * 16;
  static constexpr int kStep = kStepRows;  // rows per walked tile
  static constexpr int kLd = kHd + 8;               // bf16 row stride of the Q, K and V tiles
  static constexpr int kSLd = kStep + 4;            // float row stride of a warp's scratch
  static constexpr int kPLd = kStep + 8;            // bf16 row stride of a warp's P
  static constexpr int kFrags = kHd / 16;           // fragments across a head's columns
};

namespace wmma = nvcuda::wmma;
using Bf16 = __nv_bfloat16;
using AccFrag = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
using RowFrag = wmma::fragment<wmma::matrix_a, 16, 16, 16, Bf16, wmma::row_major>;

// Rows first.. (rows of them) of one head into tile, bf16 as stored, zeros past T and hd.
template <class M>
__device__ void loadBf16Tile(Bf16 (*tile)[M::kLd], const Bf16* head, int64_t rowStride, int first, int rows,
                             const Geometry& g) {
  for (int i = threadIdx.x; i < rows * M::kHd; i += M::kThreads) {
    const int r = i / M::kHd, d = i % M::kHd, t = first + r;
    tile[r][d] = t < g.time && d < g.headSize ? head[t * rowStride + d] : __float2bfloat16_rn(0.0f);
  }
}

// o *= scale[row] for each of the warp's 16 rows, through the warp's scratch (16 x 16 floats at
// `scratch`); lane 2r and 2r + 1 own row r and hold its scale.
template <class M>
__device__ void scaleRows(AccFrag& o, float* scratch, float scale) {
  const int lane = threadIdx.x % kWarpSize, row = lane / 2, half = lane % 2;
  __syncwarp();
  wmma::store_matrix_sync(scratch, o, M::kSLd, wmma::mem_row_major);
  __syncwarp();
  for (int c = half * 8; c < half * 8 + 8; ++c) scratch[row * M::kSLd + c] *= scale;
  __syncwarp();
  wmma::load_matrix_sync(o, scratch, M::kSLd, wmma::mem_row_major);
}

// A's fragment f (its columns 16f..): held in registers, or loaded from the warp's 16 rows of a
// shared tile into `loaded`.
__device__ inline const RowFrag& fragmentOf(const RowFrag* a, int f, RowFrag&) { return a[f]; }
template <int kLd>
__device__ const RowFrag& fragmentOf(const Bf16 (*rows)[kLd], int f, RowFrag& loaded) {
  wmma::load_matrix_sync(loaded, &rows[0][f * 16], kLd);
  return loaded;
}

// The warp's 16 x kStep product A·Bᵀ, A its 16 rows (fragmentOf), B the tile's kStep rows
// (bTile[row][d]), into the warp's scratch (row-major, M::kSLd).
template <class M, class A>
__device__ void productToScratch(A a, const Bf16 (*bTile)[M::kLd], float* scratch) {
  for (int n = 0; n < M::kStep / 16; ++n) {
    AccFrag s;
    wmma::fill_fragment(s, 0.0f);
    for (int f = 0; f < M::kFrags; ++f) {
      RowFrag loaded;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::col_major> bt;  // Bᵀ
      wmma::load_matrix_sync(bt, &bTile[n * 16][f * 16], M::kLd);
      wmma::mma_sync(s, fragmentOf(a, f, loaded), bt, s);
    }
    wmma::store_matrix_sync(scratch + n * 16, s, M::kSLd, wmma::mem_row_major);
  }
}

// acc[f] += A·B[:, 16f..]: A the warp's 16 x kStep bf16 rows at `a` (row-major, M::kPLd), B the
// tile's kStep x kHd rows (bTile[row][d]).
template <class M>
__device__ void accumulateProduct(AccFrag* acc, const Bf16* a, const Bf16 (*bTile)[M::kLd]) {
  for (int kk = 0; kk < M::kStep / 16; ++kk) {
    RowFrag af;
    wmma::load_matrix_sync(af, a + kk * 16, M::kPLd);
    for (int f = 0; f < M::kFrags; ++f) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::row_major> bf;
      wmma::load_matrix_sync(bf, &bTile[kk * 16][f * 16], M::kLd);
      wmma::mma_sync(acc[f], af, bf, acc[f]);
    }
  }
}

// The warp's 16 rows of `frags` (columns 16f.. in frags[f]) times `scale`, rounded to bf16, to
// `out` (this lane's row, its first headSize columns) where `valid`: through the warp's scratch,
// lanes 2r and 2r + 1 writing row r's halves.
template <class M>
__device__ void writeRows(const AccFrag* frags, float* scratch, Bf16* out, float scale, bool valid, int headSize) {
  const int lane = threadIdx.x % kWarpSize, row = lane / 2, half = lane % 2;
  for (int f = 0; f < M::kFrags; ++f) {
    __syncwarp();
    wmma::store_matrix_sync(scratch, frags[f], M::kSLd, wmma::mem_row_major);
    __syncwarp();
    for (int c = half * 8; c < half * 8 + 8; ++c) {
      const int d = f * 16 + c;
      if (valid && d < headSize) out[d] = __float2bfloat16_rn(scratch[row * M::kSLd + c] * scale);
    }
  }
}

template <int kHd>
__global__ void __launch_bounds__(MmaTiles<kHd>::kThreads)
    attentionForwardMmaKernel(const Bf16* __restrict__ qkv, Bf16* __restrict__ y, float* __restrict__ lse, Geometry g) {
  using M = MmaTiles<kHd>;
  alignas(32) __shared__ Bf16 kTile[M::kRows][M::kLd];  // Q on the way to its fragments, then Kj
  alignas(32) __shared__ Bf16 vTile[M::kStep][M::kLd];
  alignas(32) __shared__ float sTile[M::kWarps][16][M::kSLd];
  alignas(32) __shared__ Bf16 pTile[M::kWarps][16][M::kPLd];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, row = lane / 2, half = lane % 2;
  const int h = blockIdx.x % g.heads, first = (gridDim.y - 1 - blockIdx.y) * M::kRows;
  const int t = first + warp * 16 + row;
  const int64_t stride = 3 * static_cast<int64_t>(g.dim);
  const Bf16* sample = qkv + static_cast<int64_t>(blockIdx.x / g.heads) * g.time * stride + h * g.headSize;
  loadBf16Tile<M>(kTile, sample, stride, first, M::kRows, g);
  __syncthreads();
  RowFrag q[M::kFrags];
  AccFrag o[M::kFrags];
  for (int f = 0; f < M::kFrags; ++f) {
    wmma::load_matrix_sync(q[f], &kTile[warp * 16][f * 16], M::kLd);
    wmma::fill_fragment(o[f], 0.0f);
  }
  float* sRow = sTile[warp][row];
  Bf16* pRow = pTile[warp][row];
  float m = -INFINITY, l = 0.0f;
  const int keyTiles = (min(first + M::kRows, g.time) - 1) / M::kStep + 1;
  for (int j = 0; j < keyTiles; ++j) {
    const int keyFirst = j * M::kStep;
    __syncthreads();  // Q's fragments loaded; the previous Kj, Vj and scratch read
    loadBf16Tile<M>(kTile, sample + g.dim, stride, keyFirst, M::kStep, g);
    loadBf16Tile<M>(vTile, sample + 2 * g.dim, stride, keyFirst, M::kStep, g);
    __syncthreads();
    productToScratch<M>(q, kTile, &sTile[warp][0][0]);  // S = Q·Kᵀ
    __syncwarp();
    float tileMax = -INFINITY;
    for (int c = half * (M::kStep / 2); c < (half + 1) * (M::kStep / 2); ++c) {
      sRow[c] = keyFirst + c <= t ? sRow[c] * g.scale : -INFINITY;
      tileMax = MaxOp{}(tileMax, sRow[c]);
    }
    const float mNew = MaxOp{}(m, MaxOp{}(tileMax, __shfl_xor_sync(kFullMask, tileMax, 1)));  // finite: key 0
    const float alpha = expf(m - mNew);                                                           // 0 at the first tile
    float pSum = 0.0f;
    for (int c = half * (M::kStep / 2); c < (half + 1) * (M::kStep / 2); ++c) {
      const float p = expf(sRow[c] - mNew);  // 0 where masked
      pRow[c] = __float2bfloat16_rn(p);
      pSum += p;
    }
    l = alpha * l + pSum + __shfl_xor_sync(kFullMask, pSum, 1);
    m = mNew;
    if (!__all_sync(kFullMask, alpha == 1.0f)) {
      for (int f = 0; f < M::kFrags; ++f) scaleRows<M>(o[f], &sTile[warp][0][0], alpha);
    }
    __syncwarp();  // P written
    accumulateProduct<M>(o, &pTile[warp][0][0], vTile);  // O += P·V
  }
  writeRows<M>(o, &sTile[warp][0][0], y + (static_cast<int64_t>(blockIdx.x / g.heads) * g.time + t) * g.dim + h * g.headSize,
               1.0f / l, t < g.time, g.headSize);
  if (half == 0 && t < g.time) lse[static_cast<int64_t>(blockIdx.x) * g.time + t] = m + logf(l);
}


// dQ of 64 queries (16 per warp) on tensor cores, over the key tiles up to the block's last query:
// per tile, S = Q·Kᵀ and dP = dO·Vᵀ as fragment products through the warp's scratch, P = exp(S·scale
// − L) kept in registers (two lanes per row, half a tile each), dS = P ⊙ (dP − D) written in bf16,
// and dQ += dS·K in fragments; finally dQ · scale. Q and dO stay in fragments for the whole walk.
template <int kHd>
__global__ void __launch_bounds__(MmaTiles<kHd>::kThreads)
    attentionQueryGradMmaKernel(const Bf16* __restrict__ qkv, const Bf16* __restrict__ dy, const float* __restrict__ lse,
                                const float* __restrict__ rowDot, Bf16* __restrict__ dqkv, Geometry g) {
  using M = MmaTiles<kHd>;
  alignas(32) __shared__ Bf16 kTile[M::kRows][M::kLd];  // Q and dO on the way to their fragments, then Kj
  alignas(32) __shared__ Bf16 vTile[M::kStep][M::kLd];
  alignas(32) __shared__ float sTile[M::kWarps][16][M::kSLd];
  alignas(32) __shared__ Bf16 dsTile[M::kWarps][16][M::kPLd];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, row = lane / 2, half = lane % 2;
  const int b = blockIdx.x / g.heads, h = blockIdx.x % g.heads, first = (gridDim.y - 1 - blockIdx.y) * M::kRows;
  const int t = first + warp * 16 + row;
  const int64_t stride = 3 * static_cast<int64_t>(g.dim), sampleRow = static_cast<int64_t>(b) * g.time;
  const Bf16* sample = qkv + sampleRow * stride + h * g.headSize;
  RowFrag q[M::kFrags], dout[M::kFrags];
  AccFrag dq[M::kFrags];
  loadBf16Tile<M>(kTile, sample, stride, first, M::kRows, g);
  __syncthreads();
  for (int f = 0; f < M::kFrags; ++f) wmma::load_matrix_sync(q[f], &kTile[warp * 16][f * 16], M::kLd);
  __syncthreads();
  loadBf16Tile<M>(kTile, dy + sampleRow * g.dim + h * g.headSize, g.dim, first, M::kRows, g);
  __syncthreads();
  for (int f = 0; f < M::kFrags; ++f) {
    wmma::load_matrix_sync(dout[f], &kTile[warp * 16][f * 16], M::kLd);
    wmma::fill_fragment(dq[f], 0.0f);
  }
  const int64_t statAt = static_cast<int64_t>(blockIdx.x) * g.time + t;
  const float rowLse = t < g.time ? lse[statAt] : 0.0f, rowD = t < g.time ? rowDot[statAt] : 0.0f;
  float* sRow = sTile[warp][row];
  Bf16* dsRow = dsTile[warp][row];
  constexpr int kHalf = M::kStep / 2;
  const int keyTiles = (min(first + M::kRows, g.time) - 1) / M::kStep + 1;
  for (int j = 0; j < keyTiles; ++j) {
    const int keyFirst = j * M::kStep, c0 = half * kHalf;
    __syncthreads();  // the fragments loaded; the previous Kj, Vj and scratch read
    loadBf16Tile<M>(kTile, sample + g.dim, stride, keyFirst, M::kStep, g);
    loadBf16Tile<M>(vTile, sample + 2 * g.dim, stride, keyFirst, M::kStep, g);
    __syncthreads();
    productToScratch<M>(q, kTile, &sTile[warp][0][0]);  // S = Q·Kᵀ
    __syncwarp();
    float p[kHalf];
    for (int i = 0; i < kHalf; ++i) {
      const int key = keyFirst + c0 + i;
      p[i] = key <= t && t < g.time ? expf(sRow[c0 + i] * g.scale - rowLse) : 0.0f;
    }
    __syncwarp();  // S read before dP overwrites it
    productToScratch<M>(dout, vTile, &sTile[warp][0][0]);  // dP = dO·Vᵀ
    __syncwarp();
    for (int i = 0; i < kHalf; ++i) dsRow[c0 + i] = __float2bfloat16_rn(p[i] * (sRow[c0 + i] - rowD));
    __syncwarp();  // dS written
    accumulateProduct<M>(dq, &dsTile[warp][0][0], kTile);  // dQ += dS·K
  }
  writeRows<M>(dq, &sTile[warp][0][0], dqkv + (sampleRow + t) * stride + h * g.headSize, g.scale, t < g.time,
               g.headSize);
}

// dK and dV of 64 keys (16 per warp) on tensor cores, over the query tiles from the block's first
// key to T: per tile, Sᵀ = K·Qᵀ through the warp's scratch, Pᵀ = exp(Sᵀ·scale − L) kept in registers
// (two lanes per key, half a tile each) and written in bf16 over the scratch for dV += Pᵀ·dO; then
// dPᵀ = V·dOᵀ the same way, and dSᵀ = Pᵀ ⊙ (dPᵀ − D) in bf16 for dK += dSᵀ·Q; finally dK · scale.
// V stays in shared memory, K in fragments up to hd 64; at hd 128, where the accumulators alone
// take 128 registers, K stays in shared memory too and the query tiles are 16 rows, to fit 48 KiB.
// Shared memory per block (kHd 32 / 64 / 128): 32.0 / 44.0 / 47.5 KiB.
template <int kHd>
__global__ void __launch_bounds__(MmaTiles<kHd>::kThreads)
    attentionKeyGradMmaKernel(const Bf16* __restrict__ qkv, const Bf16* __restrict__ dy, const float* __restrict__ lse,
                              const float* __restrict__ rowDot, Bf16* __restrict__ dqkv, Geometry g) {
  constexpr bool kKeysShared = kHd > 64;
  using M = MmaTiles<kHd, kKeysShared ? 16 : 64>;
  union Scratch {  // a warp's: Sᵀ and dPᵀ in fp32, then Pᵀ and dSᵀ in bf16 over them
    float s[16][M::kSLd];
    Bf16 p[16][M::kPLd];
  };
  alignas(32) __shared__ Bf16 kTile[kKeysShared ? M::kRows : 1][M::kLd];
  alignas(32) __shared__ Bf16 vTile[M::kRows][M::kLd];  // K on the way to its fragments, then V
  alignas(32) __shared__ Bf16 qTile[M::kStep][M::kLd];
  alignas(32) __shared__ Bf16 doTile[M::kStep][M::kLd];
  alignas(32) __shared__ Scratch scratch[M::kWarps];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize, row = lane / 2, half = lane % 2;
  const int b = blockIdx.x / g.heads, h = blockIdx.x % g.heads, first = blockIdx.y * M::kRows;
  const int key = first + warp * 16 + row;
  const int64_t stride = 3 * static_cast<int64_t>(g.dim), sampleRow = static_cast<int64_t>(b) * g.time;
  const int64_t statFirst = static_cast<int64_t>(blockIdx.x) * g.time;
  const Bf16* sample = qkv + sampleRow * stride + h * g.headSize;
  RowFrag k[kKeysShared ? 1 : M::kFrags];
  AccFrag dk[M::kFrags], dv[M::kFrags];
  for (int f = 0; f < M::kFrags; ++f) {
    wmma::fill_fragment(dk[f], 0.0f);
    wmma::fill_fragment(dv[f], 0.0f);
  }
  if constexpr (kKeysShared) {
    loadBf16Tile<M>(kTile, sample + g.dim, stride, first, M::kRows, g);
  } else {
    loadBf16Tile<M>(vTile, sample + g.dim, stride, first, M::kRows, g);
    __syncthreads();
    for (int f = 0; f < M::kFrags; ++f) wmma::load_matrix_sync(k[f], &vTile[warp * 16][f * 16], M::kLd);
    __syncthreads();
  }
  loadBf16Tile<M>(vTile, sample + 2 * g.dim, stride, first, M::kRows, g);
  Scratch& mine = scratch[warp];
  constexpr int kHalf = M::kStep / 2;
  const int c0 = half * kHalf;
  for (int queryFirst = first; queryFirst < g.time; queryFirst += M::kStep) {
    __syncthreads();  // K and V stored; the previous Qi and dOi read
    loadBf16Tile<M>(qTile, sample, stride, queryFirst, M::kStep, g);
    loadBf16Tile<M>(doTile, dy + sampleRow * g.dim + h * g.headSize, g.dim, queryFirst, M::kStep, g);
    __syncthreads();
    if constexpr (kKeysShared) {  // Sᵀ = K·Qᵀ
      productToScratch<M>(&kTile[warp * 16], qTile, &mine.s[0][0]);
    } else {
      productToScratch<M>(k, qTile, &mine.s[0][0]);
    }
    __syncwarp();
    float p[kHalf];  // Pᵀ, then dSᵀ; 0 where masked (also every key past T: key ≤ query < T)
    for (int i = 0; i < kHalf; ++i) {
      const int query = queryFirst + c0 + i;
      p[i] = key <= query && query < g.time ? expf(mine.s[row][c0 + i] * g.scale - lse[statFirst + query]) : 0.0f;
    }
    __syncwarp();  // Sᵀ read before Pᵀ overwrites it
    for (int i = 0; i < kHalf; ++i) mine.p[row][c0 + i] = __float2bfloat16_rn(p[i]);
    __syncwarp();
    accumulateProduct<M>(dv, &mine.p[0][0], doTile);  // dV += Pᵀ·dO
    __syncwarp();  // Pᵀ read before dPᵀ overwrites it
    productToScratch<M>(&vTile[warp * 16], doTile, &mine.s[0][0]);  // dPᵀ = V·dOᵀ
    __syncwarp();
    for (int i = 0; i < kHalf; ++i) {
      const int query = queryFirst + c0 + i;
      if (p[i] != 0.0f) p[i] *= mine.s[row][c0 + i] - rowDot[statFirst + query];
    }
    __syncwarp();  // dPᵀ read before dSᵀ overwrites it
    for (int i = 0; i < kHalf; ++i) mine.p[row][c0 + i] = __float2bfloat16_rn(p[i]);
    __syncwarp();
    accumulateProduct<M>(dk, &mine.p[0][0], qTile);  // dK += dSᵀ·Q
  }
  Bf16* out = dqkv + (sampleRow + key) * stride + h * g.headSize;
  writeRows<M>(dk, &mine.s[0][0], out + g.dim, g.scale, key < g.time, g.headSize);
  writeRows<M>(dv, &mine.s[0][0], out + 2 * g.dim, 1.0f, key < g.time, g.headSize);
}

template <int kHd>
dim3 mmaGrid(int64_t batch, const Geometry& g) {
  constexpr int kRows = MmaTiles<kHd>::kRows;
  return dim3(static_cast<unsigned>(batch * g.heads), static_cast<unsigned>((g.time + kRows - 1) / kRows));
}

}  // namespace

void forwardMma(const void* qkv, void* y, float* lse, const Geometry& g, int64_t batch, cudaStream_t stream) {
  forBucket(g.headSize, [&](auto bucket) {
    constexpr int kHd = decltype(bucket)::value;
    COHORT_LAUNCH((attentionForwardMmaKernel<kHd>), mmaGrid<kHd>(batch, g), MmaTiles<kHd>::kThreads, 0, stream)(
        static_cast<const Bf16*>(qkv), static_cast<Bf16*>(y), lse, g);
  });
}

void queryGradMma(const GradBuffers& b, const Geometry& g, int64_t batch, cudaStream_t stream) {
  forBucket(g.headSize, [&](auto bucket) {
    constexpr int kHd = decltype(bucket)::value;
    COHORT_LAUNCH((attentionQueryGradMmaKernel<kHd>), mmaGrid<kHd>(batch, g), MmaTiles<kHd>::kThreads, 0, stream)(
        static_cast<const Bf16*>(b.qkv), static_cast<const Bf16*>(b.dy), b.lse, b.rowDot, static_cast<Bf16*>(b.dqkv),
        g);
  });
}

void keyGradMma(const GradBuffers& b, const Geometry& g, int64_t batch, cudaStream_t stream) {
  forBucket(g.headSize, [&](auto bucket) {
    constexpr int kHd = decltype(bucket)::value;
    COHORT_LAUNCH((attentionKeyGradMmaKernel<kHd>), mmaGrid<kHd>(batch, g), MmaTiles<kHd>::kThreads, 0, stream)(
        static_cast<const Bf16*>(b.qkv), static_cast<const Bf16*>(b.dy), b.lse, b.rowDot, static_cast<Bf16*>(b.dqkv),
        g);
  });
}

}  // namespace cohort::runtime::cuda::attention
