// The fused causal attention's bf16 forward on tensor cores (runtime/cuda/attention_mma.h),
// FlashAttention-2's way on the warp-level PTX layer (warp_mma.h: mma.sync m16n8k16, ldmatrix,
// cp.async); bf16 inputs, fp32 accumulation. The backward is attention_mma_backward.cu's; the fp32
// kernels (CUDA cores) are attention_kernels.cu's, whose opening comment gives the algorithm.
#include "runtime/cuda/attention_mma.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "runtime/cuda/elements.h"
#include "runtime/cuda/launch.h"
#include "runtime/cuda/warp_mma.h"

namespace cohort::runtime::cuda::attention {
namespace {

using namespace launch;  // kWarpSize, kFullMask, MaxOp, SumOp (launch.h)

using Bf16 = __nv_bfloat16;

// Rows first.. (rows of them) of one head into tile, bf16 as stored, zeros past T and hd (M: ForwardTiles).
template <class M>
__device__ void loadBf16Tile(Bf16 (*tile)[M::kLd], const Bf16* head, int64_t rowStride, int first, int rows,
                             const Geometry& g) {
  for (int i = threadIdx.x; i < rows * M::kHd; i += M::kThreads) {
    const int r = i / M::kHd, d = i % M::kHd, t = first + r;
    tile[r][d] = t < g.time && d < g.headSize ? head[t * rowStride + d] : __float2bfloat16_rn(0.0f);
  }
}

// ---- The bf16 forward, FlashAttention-2's way (mma.sync through warp_mma.h) ----
//
// A block of 4 warps owns kRows = 64 queries, 16 per warp, and walks the key tiles of kStep keys
// (64; 32 at kHd 128) up to its last query, K and V of tile j + 1 loading (cp.async, 16 bytes a
// thread, one group per tile) into the other half of a double buffer while tile j is computed.
// Per warp and tile, in registers only:
//   S = Q·Kᵀ          mma16816, Q's A fragments held since the start, K's B fragments by ldmatrix;
//   mask              key > query → −∞, on the diagonal tiles only (keyFirst + kStep > the block's
//                     first query; the rest are below the diagonal, and keys past T lie there too);
//   mNew = max(m, rowmax S)   each lane holds 2 columns per 8 of rows groupID and groupID + 8; the
//                     row's 4 lanes combine with __shfl_xor_sync 1 then 2, so all four hold the
//                     same max;
//   P = exp(S·scale − mNew·scale), alpha = exp((m − mNew)·scale); lanePartialSum = alpha ·
//                     lanePartialSum + Σ own P (fp32, unrounded P); O ·= alpha;
//   O += P·V          S's C fragments re-packed in bf16 as the A fragments of P (the layouts agree:
//                     C's columns 2tid..+1 of key n-tiles 2k and 2k + 1 are A's k-columns), V's B
//                     fragments by ldmatrix .trans.
// At the end the row's 4 partial sums are combined the same butterfly way (so every lane of a row
// divides by the same l, and L = m·scale + log l is the same wherever it is read), O / l is staged in
// bf16 through shared memory and written with 16-byte stores. Everything a sum meets is in an order
// fixed by the shape alone.
//
// Q's tile is loaded through the K double buffer (2·kStep ≥ kRows rows) before the walk. Shared
// memory per block (kHd 32 / 64 / 128): 20.0 / 36.0 / 34.0 KiB. The 16-byte copies need head sizes
// that are multiples of 8 and 16-byte aligned qkv and y (kVector); any other shape runs the same
// kernel with element-wise loads and stores (the slow path).
template <int kHdBucket>
struct ForwardTiles {
  static constexpr int kHd = kHdBucket;
  static constexpr int kWarps = 4, kThreads = kWarps * kWarpSize, kRows = kWarps * 16;
  static constexpr int kStep = kHd > 64 ? 32 : 64;  // keys per tile
  static constexpr int kLd = kHd + 8;               // bf16 row stride: 16-byte rows, ldmatrix without conflicts
  static constexpr int kKeyTiles = kStep / 8;       // n-tiles of S
  static constexpr int kHeadTiles = kHd / 8;        // n-tiles of O
  static constexpr int kChunks = kHd / 8;           // 16-byte pieces of a row
  static_assert(2 * kStep >= kRows, "Q's tile goes through the K double buffer");
};

// Rows first.. (rows of them) of one head into tile: 16-byte cp.async copies under kVector (the
// caller commits the group), else element by element; zeros past T and past headSize.
template <class F, bool kVector>
__device__ void copyTile(Bf16 (*tile)[F::kLd], const Bf16* head, int64_t rowStride, int first, int rows,
                         const Geometry& g) {
  if constexpr (kVector) {
    for (int i = threadIdx.x; i < rows * F::kChunks; i += F::kThreads) {
      const int r = i / F::kChunks, d = i % F::kChunks * 8, t = first + r;
      const bool valid = t < g.time && d < g.headSize;
      ptx::cpAsync16(&tile[r][d], valid ? head + t * rowStride + d : head, valid);
    }
  } else {
    loadBf16Tile<F>(tile, head, rowStride, first, rows, g);
  }
}

// Of the row a lane's element e of a C fragment lies in (e < 2: row groupID, else groupID + 8).
__device__ __forceinline__ int fragmentRow(int lane, int e) { return lane / 4 + (e >= 2 ? 8 : 0); }

// The warp's S = Q·Kᵀ (16 x kStep) into s, with Q's A fragments q[kk] (columns 16kk..) and K's rows
// in kTile ([key][d]): two key n-tiles per ldmatrixX4.
template <class F>
__device__ void scores(float (&s)[F::kKeyTiles][4], const uint32_t (&q)[F::kHd / 16][4], const Bf16 (*kTile)[F::kLd]) {
  const int lane = threadIdx.x % kWarpSize;
  for (int n = 0; n < F::kKeyTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
  for (int kk = 0; kk < F::kHd / 16; ++kk) {
    for (int n = 0; n < F::kKeyTiles; n += 2) {
      // Matrices (keys 8n.., d 16kk..), (.., d 16kk + 8..), (keys 8n + 8.., d 16kk..), (.., d 16kk + 8..).
      uint32_t b[4];
      ptx::ldmatrixX4(b, &kTile[n * 8 + lane / 16 * 8 + lane % 8][kk * 16 + lane / 8 % 2 * 8]);
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      ptx::mma16816(s[n], q[kk], b0, s[n]);
      ptx::mma16816(s[n + 1], q[kk], b1, s[n + 1]);
    }
  }
}

// Online softmax over one tile for the lane's two rows (r = 0: groupID, 1: groupID + 8): masks S
// (on diagonal tiles), turns it into P in place, updates m, the lane's partial sums and rescales o.
template <class F>
__device__ void softmaxTile(float (&s)[F::kKeyTiles][4], float (&o)[F::kHeadTiles][4], float (&m)[2],
                            float (&partial)[2], int keyFirst, int rowFirst, bool diagonal, float scaleLog2) {
  const int lane = threadIdx.x % kWarpSize;
  if (diagonal) {
    for (int n = 0; n < F::kKeyTiles; ++n) {
      for (int e = 0; e < 4; ++e) {
        if (keyFirst + n * 8 + 2 * (lane % 4) + e % 2 > rowFirst + fragmentRow(lane, e)) s[n][e] = -INFINITY;
      }
    }
  }
  for (int r = 0; r < 2; ++r) {
    float tileMax = -INFINITY;
    for (int n = 0; n < F::kKeyTiles; ++n) tileMax = MaxOp{}(tileMax, MaxOp{}(s[n][2 * r], s[n][2 * r + 1]));
    const float mNew = MaxOp{}(m[r], ptx::acrossFragmentRow(tileMax, MaxOp{}));  // finite: every row sees key 0 first
    const float alpha = exp2f((m[r] - mNew) * scaleLog2), offset = mNew * scaleLog2;  // alpha 0 at the first tile
    float sum = 0.0f;
    for (int n = 0; n < F::kKeyTiles; ++n) {
      for (int e = 2 * r; e < 2 * r + 2; ++e) {
        s[n][e] = exp2f(fmaf(s[n][e], scaleLog2, -offset));  // 0 where masked
        sum += s[n][e];
      }
    }
    partial[r] = alpha * partial[r] + sum;
    m[r] = mNew;
    for (int d = 0; d < F::kHeadTiles; ++d) o[d][2 * r] *= alpha, o[d][2 * r + 1] *= alpha;
  }
}

// o += P·V: P from S's fragments (bf16), V's rows in vTile ([key][d]) by ldmatrix .trans, two head
// n-tiles per ldmatrixX4Trans.
template <class F>
__device__ void accumulateValues(float (&o)[F::kHeadTiles][4], const float (&p)[F::kKeyTiles][4],
                                 const Bf16 (*vTile)[F::kLd]) {
  const int lane = threadIdx.x % kWarpSize;
  for (int kk = 0; kk < F::kStep / 16; ++kk) {
    const float(&lo)[4] = p[2 * kk], (&hi)[4] = p[2 * kk + 1];
    const uint32_t a[4] = {ptx::packBf16x2(lo[0], lo[1]), ptx::packBf16x2(lo[2], lo[3]), ptx::packBf16x2(hi[0], hi[1]),
                           ptx::packBf16x2(hi[2], hi[3])};
    for (int d = 0; d < F::kHeadTiles; d += 2) {
      // Matrices (keys 16kk.., d 8d..), (keys 16kk + 8.., d 8d..), (keys 16kk.., d 8d + 8..), (keys 16kk + 8.., ..).
      uint32_t b[4];
      ptx::ldmatrixX4Trans(b, &vTile[kk * 16 + lane / 8 % 2 * 8 + lane % 8][d * 8 + lane / 16 * 8]);
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      ptx::mma16816(o[d], a, b0, o[d]);
      ptx::mma16816(o[d + 1], a, b1, o[d + 1]);
    }
  }
}

// The warp's 16 rows of o / l in bf16 to its rows of `stage`, then to y (rows rowFirst.., the first
// headSize columns of each): 16-byte stores under kVector, else element by element.
template <class F, bool kVector>
__device__ void storeOutput(const float (&o)[F::kHeadTiles][4], const float (&l)[2], Bf16 (*stage)[F::kLd], Bf16* y,
                            int rowFirst, const Geometry& g) {
  const int lane = threadIdx.x % kWarpSize;
  for (int d = 0; d < F::kHeadTiles; ++d) {
    for (int r = 0; r < 2; ++r) {
      const uint32_t pair = ptx::packBf16x2(o[d][2 * r] / l[r], o[d][2 * r + 1] / l[r]);
      memcpy(&stage[fragmentRow(lane, 2 * r)][d * 8 + 2 * (lane % 4)], &pair, sizeof pair);
    }
  }
  __syncwarp();
  const int64_t rowStride = g.dim;
  for (int i = lane; i < 16 * F::kChunks; i += kWarpSize) {
    const int r = i / F::kChunks, d = i % F::kChunks * 8, t = rowFirst + r;
    if (t >= g.time) continue;
    if constexpr (kVector) {
      if (d < g.headSize) *reinterpret_cast<elements::Bf16Eight*>(y + t * rowStride + d) = *reinterpret_cast<const elements::Bf16Eight*>(&stage[r][d]);
    } else {
      for (int c = d; c < d + 8 && c < g.headSize; ++c) y[t * rowStride + c] = stage[r][c];
    }
  }
}

template <int kHd, bool kVector>
__global__ void __launch_bounds__(ForwardTiles<kHd>::kThreads)
    attentionForwardMmaKernel(const Bf16* __restrict__ qkv, Bf16* __restrict__ y, float* __restrict__ lse, Geometry g) {
  using F = ForwardTiles<kHd>;
  alignas(128) __shared__ Bf16 kTiles[2][F::kStep][F::kLd];  // Q's tile first (2·kStep rows), then Kj, Kj+1
  alignas(128) __shared__ Bf16 vTiles[2][F::kStep][F::kLd];
  Bf16(*rows)[F::kLd] = kTiles[0];  // the buffer as 2·kStep rows: Q, then O's staging
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int b = blockIdx.x / g.heads, h = blockIdx.x % g.heads, first = (gridDim.y - 1 - blockIdx.y) * F::kRows;
  const int rowFirst = first + warp * 16;
  const int64_t stride = 3 * static_cast<int64_t>(g.dim);
  const Bf16* sample = qkv + static_cast<int64_t>(b) * g.time * stride + h * g.headSize;
  copyTile<F, kVector>(rows, sample, stride, first, F::kRows, g);
  ptx::cpAsyncCommit();
  ptx::cpAsyncWait<0>();
  __syncthreads();
  uint32_t q[kHd / 16][4];  // Q's A fragments, columns 16kk..
  for (int kk = 0; kk < kHd / 16; ++kk) ptx::ldmatrixX4(q[kk], &rows[warp * 16 + lane % 16][kk * 16 + lane / 16 * 8]);
  __syncthreads();  // Q read before K overwrites it
  float o[F::kHeadTiles][4] = {}, m[2] = {-INFINITY, -INFINITY}, partial[2] = {0.0f, 0.0f};
  const float scaleLog2 = g.scale * 1.4426950408889634f;  // exp(x·scale) = exp2(x·scaleLog2)
  const int keyTiles = (min(first + F::kRows, g.time) - 1) / F::kStep + 1;
  auto load = [&](int j) {
    copyTile<F, kVector>(kTiles[j % 2], sample + g.dim, stride, j * F::kStep, F::kStep, g);
    copyTile<F, kVector>(vTiles[j % 2], sample + 2 * g.dim, stride, j * F::kStep, F::kStep, g);
    ptx::cpAsyncCommit();
  };
  load(0);
  for (int j = 0; j < keyTiles; ++j) {
    if (j + 1 < keyTiles) {
      load(j + 1);  // into the buffer tile j − 1 used, read by all before the last barrier
      ptx::cpAsyncWait<1>();
    } else {
      ptx::cpAsyncWait<0>();
    }
    __syncthreads();  // tile j landed for every thread's copies
    float s[F::kKeyTiles][4];
    scores<F>(s, q, kTiles[j % 2]);
    const int keyFirst = j * F::kStep;
    softmaxTile<F>(s, o, m, partial, keyFirst, rowFirst, keyFirst + F::kStep > first, scaleLog2);
    accumulateValues<F>(o, s, vTiles[j % 2]);
    __syncthreads();  // tile j read before tile j + 2 is loaded over it
  }
  const float l[2] = {ptx::acrossFragmentRow(partial[0], SumOp{}), ptx::acrossFragmentRow(partial[1], SumOp{})};
  storeOutput<F, kVector>(o, l, &rows[warp * 16], y + static_cast<int64_t>(b) * g.time * g.dim + h * g.headSize,
                          rowFirst, g);
  for (int r = 0; r < 2; ++r) {
    const int t = rowFirst + fragmentRow(lane, 2 * r);
    if (lane % 4 == 0 && t < g.time) lse[static_cast<int64_t>(blockIdx.x) * g.time + t] = m[r] * g.scale + logf(l[r]);
  }
}

}  // namespace

void forwardMma(const void* qkv, void* y, float* lse, const Geometry& g, int64_t batch, cudaStream_t stream) {
  const bool vector = g.headSize % 8 == 0 && reinterpret_cast<uintptr_t>(qkv) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(y) % 16 == 0;
  forBucket(g.headSize, [&](auto bucket) {
    constexpr int kHd = decltype(bucket)::value;
    using F = ForwardTiles<kHd>;
    const dim3 grid(static_cast<unsigned>(batch * g.heads), static_cast<unsigned>((g.time + F::kRows - 1) / F::kRows));
    if (vector) {
      COHORT_LAUNCH((attentionForwardMmaKernel<kHd, true>), grid, F::kThreads, 0, stream)(
          static_cast<const Bf16*>(qkv), static_cast<Bf16*>(y), lse, g);
    } else {
      COHORT_LAUNCH((attentionForwardMmaKernel<kHd, false>), grid, F::kThreads, 0, stream)(
          static_cast<const Bf16*>(qkv), static_cast<Bf16*>(y), lse, g);
    }
  });
}

}  // namespace cohort::runtime::cuda::attention
