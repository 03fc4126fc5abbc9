// Fused causal attention (runtime/cuda/attention_kernels.h): FlashAttention-2's forward and
// backward on CUDA cores for fp32 data, never storing the T×T scores. bf16 data runs the same
// algorithm on tensor cores (attention_mma.cu); the row dot D below serves both types.
//
// Launch: every kernel but the row dot runs blocks of kThreads = 256 threads on a grid of
// (B·H, tiles): blockIdx.x picks the sample and head, blockIdx.y a tile of kRows queries (forward,
// dQ) or keys (dK and dV). Within a block, kLanes = 256 / kRows consecutive threads of one warp own
// one row of the tile (threadIdx.x / kLanes); lane i of them computes the row's scores for columns
// i, i + kLanes, ... and accumulates its output columns i, i + kLanes, ... of the head. The head
// size picks a bucket kHd ∈ {32, 64, 128}: tiles hold kHd columns, those past hd are zeros (they add
// exactly nothing to any dot product). kRows = 32 for kHd ≤ 64, 16 for 128, so that the four
// [kRows, kHd + 1] tiles of the backward kernels stay under 48 KiB of static shared memory: per
// block (kHd 32 / 64 / 128) the forward takes 12.4 / 20.4 / 17.2 KiB, dK and dV 25.0 / 41.0 /
// 34.5 KiB, dQ 20.6 / 36.6 / 33.3 KiB. The row dot D is one warp per row, a grid-stride kernel.
//
// The algorithm, for one (sample, head), with S = q·kᵀ · scale, scale = 1/√hd, causal mask
// (query t sees keys 0..t):
//
//   Forward, one block per query tile Qi (its rows in qTile): m = −∞, l = 0, acc = 0 per row.
//   For each key tile Kj with j ≤ i (tiles after the diagonal are masked whole and skipped; the
//   diagonal tile masks key > query):
//     s = Qi·Kjᵀ · scale                        (this tile's scores, in registers)
//     mNew = max(m, rowmax s);  alpha = exp(m − mNew)
//     p = exp(s − mNew);        l = alpha · l + rowsum p
//     acc = alpha · acc + p·Vj                  (p through pTile; Vj loaded over Kj's tile)
//     m = mNew
//   O = acc / l, and the log-sum-exp L = m + log l per row, the only statistic backward needs:
//   P = exp(S − L) is the softmax again (to rounding). Every row sees key 0, so l ≥ 1 and L is finite.
//
//   Backward: first D = rowsum(dO ⊙ O) per row (rowDot: Σ_c P_c·dP_c = dO·Σ_c P_c v_c = dO·O), then
//   P = exp(S − L), dP = dO·vᵀ and dS = P ⊙ (dP − D) recomputed tile by tile, twice, so that each
//   output has one owner and no atomics are needed:
//     dK and dV, one block per key tile Kj, looping over the query tiles i ≥ j:
//       dV_j += Pᵀ·dO_i,  dK_j += dSᵀ·Q_i             (then dK_j · scale)
//     dQ, one block per query tile Qi, looping over the key tiles j ≤ i:
//       dQ_i += dS·K_j                                 (then dQ_i · scale)
//   Each sum runs in tile order and, within a tile, in row order: fixed by the shape alone.
//
// The kernels read and write through elements.h (fp32 storage here; the row dot D also serves bf16,
// widening every load), so the math, the tiles in shared memory, L and D are fp32.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "runtime/cuda/attention_kernels.h"
#include "runtime/cuda/attention_mma.h"
#include "runtime/cuda/attention_mma_backward.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/elements.h"
#include "runtime/cuda/launch.h"
#include "runtime/error.h"
#include "runtime/gpu_scratch.h"

namespace cohort::runtime::cuda {
namespace {

// Loops over a tile row's registers are unrolled, so that acc[], dk[] and friends stay in registers
// (nvcc only: g++ compiles the emulated device's kernels and knows no such pragma).
#ifdef COHORT_CUDASIM
#define COHORT_UNROLL
#define COHORT_UNROLL_8
#else
#define COHORT_UNROLL _Pragma("unroll")
#define COHORT_UNROLL_8 _Pragma("unroll 8")
#endif

using namespace launch;  // kThreads, kWarpSize, kFullMask, RowGroup, groupReduce, MaxOp, SumOp (launch.h)

// The tiling of one head-size bucket (see the opening comment).
template <int kHdBucket>
struct Tiles {
  static constexpr int kHd = kHdBucket;             // columns a tile row holds (hd ≤ kHd)
  static constexpr int kRows = kHd > 64 ? 16 : 32;  // queries or keys per tile
  static constexpr int kLanes = kThreads / kRows;   // threads per tile row, inside one warp
  static constexpr int kCols = kHd / kLanes;        // output columns per thread: lane + kLanes·j
  static constexpr int kPerLane = kRows / kLanes;   // scores per thread and tile: column lane + kLanes·i
  static constexpr int kStride = kHd + 1;           // +1: consecutive rows start in different banks
  static_assert(kLanes <= kWarpSize && kWarpSize % kLanes == 0 && kCols >= 1 && kPerLane >= 1);
};

using attention::Geometry;

using elements::load;
using elements::store;

// Rows first.. of one head (its first column at `head`, rows `rowStride` apart) into tile, zeros
// for rows past T and columns past hd.
template <class C, class Storage>
__device__ void loadTile(float (*tile)[C::kStride], const Storage* head, int64_t rowStride, int first,
                         const Geometry& g) {
  for (int i = threadIdx.x; i < C::kRows * C::kHd; i += kThreads) {
    const int r = i / C::kHd, d = i % C::kHd, t = first + r;
    tile[r][d] = t < g.time && d < g.headSize ? load(head[t * rowStride + d]) : 0.0f;
  }
}

template <class C>
__device__ __forceinline__ float dot(const float* a, const float* b) {
  float s = 0.0f;
  COHORT_UNROLL_8
  for (int d = 0; d < C::kHd; ++d) s += a[d] * b[d];
  return s;
}

// Combines v over the kLanes threads of a tile row (an xor butterfly inside the warp).
template <class C, class Op>
__device__ __forceinline__ float rowReduce(float v, Op op) {
  for (int offset = C::kLanes / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// The forward of one query tile (the last tiles, which see the most keys, first).
template <class Storage, int kHd>
__global__ void attentionForwardKernel(const Storage* __restrict__ qkv, Storage* __restrict__ y,
                                       float* __restrict__ lse, Geometry g) {
  using C = Tiles<kHd>;
  __shared__ float qTile[C::kRows][C::kStride];
  __shared__ float kvTile[C::kRows][C::kStride];  // Kj, then Vj
  __shared__ float pTile[C::kRows][C::kRows + 1];
  const int h = blockIdx.x % g.heads, qBlock = gridDim.y - 1 - blockIdx.y;
  const int row = threadIdx.x / C::kLanes, lane = threadIdx.x % C::kLanes;
  const int first = qBlock * C::kRows, t = first + row;
  const int64_t stride = 3 * static_cast<int64_t>(g.dim);
  const Storage* sample = qkv + static_cast<int64_t>(blockIdx.x / g.heads) * g.time * stride + h * g.headSize;
  loadTile<C>(qTile, sample, stride, first, g);
  float m = -INFINITY, l = 0.0f, acc[C::kCols] = {};
  for (int kBlock = 0; kBlock <= qBlock; ++kBlock) {
    const int keyFirst = kBlock * C::kRows;
    __syncthreads();  // qTile loaded; the previous Vj read
    loadTile<C>(kvTile, sample + g.dim, stride, keyFirst, g);
    __syncthreads();
    float s[C::kPerLane], tileMax = -INFINITY;
    COHORT_UNROLL
    for (int i = 0; i < C::kPerLane; ++i) {
      const int c = lane + C::kLanes * i;
      s[i] = keyFirst + c <= t ? dot<C>(qTile[row], kvTile[c]) * g.scale : -INFINITY;
      tileMax = MaxOp{}(tileMax, s[i]);
    }
    const float mNew = MaxOp{}(m, rowReduce<C>(tileMax, MaxOp{}));  // finite: key keyFirst ≤ t
    const float alpha = expf(m - mNew);                             // 0 at the first tile
    float pSum = 0.0f;
    COHORT_UNROLL
    for (int i = 0; i < C::kPerLane; ++i) {
      const float p = expf(s[i] - mNew);  // 0 where masked
      pTile[row][lane + C::kLanes * i] = p;
      pSum += p;
    }
    l = alpha * l + rowReduce<C>(pSum, SumOp{});
    m = mNew;
    __syncthreads();  // Kj read, pTile written
    loadTile<C>(kvTile, sample + 2 * g.dim, stride, keyFirst, g);
    __syncthreads();
    COHORT_UNROLL
    for (int j = 0; j < C::kCols; ++j) acc[j] *= alpha;
    for (int c = 0; c < C::kRows; ++c) {
      const float p = pTile[row][c];
      COHORT_UNROLL
      for (int j = 0; j < C::kCols; ++j) acc[j] += p * kvTile[c][lane + C::kLanes * j];
    }
  }
  if (t >= g.time) return;
  const int b = blockIdx.x / g.heads;
  Storage* out = y + (static_cast<int64_t>(b) * g.time + t) * g.dim + h * g.headSize;
  const float inv = 1.0f / l;
  COHORT_UNROLL
  for (int j = 0; j < C::kCols; ++j) {
    const int d = lane + C::kLanes * j;
    if (d < g.headSize) out[d] = store<Storage>(acc[j] * inv);
  }
  if (lane == 0) lse[static_cast<int64_t>(blockIdx.x) * g.time + t] = m + logf(l);
}

// D = rowsum(dO ⊙ O) per (sample, head, position), in L's [B, H, T] order; a warp per row.
template <class Storage>
__global__ void attentionRowDotKernel(const Storage* __restrict__ y, const Storage* __restrict__ dy,
                                      float* __restrict__ rowDot, Geometry g, int64_t rows) {
  using G = RowGroup<kWarpSize>;
  for (int64_t r = G::firstRow(); r < rows; r += G::rowStride()) {
    const int64_t bh = r / g.time, t = r % g.time, b = bh / g.heads, h = bh % g.heads;
    const int64_t at = (b * g.time + t) * g.dim + h * g.headSize;
    float sum = 0.0f;
    for (int d = G::lane(); d < g.headSize; d += kWarpSize) sum += load(dy[at + d]) * load(y[at + d]);
    sum = groupReduce<kWarpSize>(sum, SumOp{});
    if (G::lane() == 0) rowDot[r] = sum;
  }
}

// The per-row statistics of tile rows first.. (zeros past T) into shared memory.
template <class C>
__device__ void loadRowStats(float* lseTile, float* dTile, const float* lse, const float* rowDot, int first,
                             const Geometry& g) {
  if (threadIdx.x < C::kRows) {
    const int t = first + threadIdx.x;
    lseTile[threadIdx.x] = t < g.time ? lse[t] : 0.0f;
    dTile[threadIdx.x] = t < g.time ? rowDot[t] : 0.0f;
  }
}

// dK and dV of one key tile, over the query tiles from the diagonal on.
template <class Storage, int kHd>
__global__ void attentionKeyGradKernel(const Storage* __restrict__ qkv, const Storage* __restrict__ dy,
                                       const float* __restrict__ lse, const float* __restrict__ rowDot,
                                       Storage* __restrict__ dqkv, Geometry g) {
  using C = Tiles<kHd>;
  __shared__ float kTile[C::kRows][C::kStride], vTile[C::kRows][C::kStride];
  __shared__ float qTile[C::kRows][C::kStride], dyTile[C::kRows][C::kStride];
  __shared__ float pTile[C::kRows][C::kRows + 1], dsTile[C::kRows][C::kRows + 1];  // [key][query]
  __shared__ float lseTile[C::kRows], dTile[C::kRows];
  const int b = blockIdx.x / g.heads, h = blockIdx.x % g.heads, kBlock = blockIdx.y;
  const int row = threadIdx.x / C::kLanes, lane = threadIdx.x % C::kLanes;
  const int keyFirst = kBlock * C::kRows, key = keyFirst + row;
  const int64_t stride = 3 * static_cast<int64_t>(g.dim), sampleRow = static_cast<int64_t>(b) * g.time;
  const Storage* sample = qkv + sampleRow * stride + h * g.headSize;
  const Storage* dySample = dy + sampleRow * g.dim + h * g.headSize;
  const float* lseHead = lse + static_cast<int64_t>(blockIdx.x) * g.time;
  const float* dHead = rowDot + static_cast<int64_t>(blockIdx.x) * g.time;
  loadTile<C>(kTile, sample + g.dim, stride, keyFirst, g);
  loadTile<C>(vTile, sample + 2 * g.dim, stride, keyFirst, g);
  float dk[C::kCols] = {}, dv[C::kCols] = {};
  for (int qBlock = kBlock; qBlock < static_cast<int>(gridDim.y); ++qBlock) {
    const int qFirst = qBlock * C::kRows;
    __syncthreads();  // the previous query tile read
    loadTile<C>(qTile, sample, stride, qFirst, g);
    loadTile<C>(dyTile, dySample, g.dim, qFirst, g);
    loadRowStats<C>(lseTile, dTile, lseHead, dHead, qFirst, g);
    __syncthreads();
    COHORT_UNROLL
    for (int i = 0; i < C::kPerLane; ++i) {
      const int r = lane + C::kLanes * i, t = qFirst + r;
      float p = 0.0f, ds = 0.0f;
      if (t >= key && t < g.time) {
        p = expf(dot<C>(qTile[r], kTile[row]) * g.scale - lseTile[r]);
        ds = p * (dot<C>(dyTile[r], vTile[row]) - dTile[r]);
      }
      pTile[row][r] = p;
      dsTile[row][r] = ds;
    }
    __syncthreads();
    for (int r = 0; r < C::kRows; ++r) {
      const float p = pTile[row][r], ds = dsTile[row][r];
      COHORT_UNROLL
      for (int j = 0; j < C::kCols; ++j) {
        dv[j] += p * dyTile[r][lane + C::kLanes * j];
        dk[j] += ds * qTile[r][lane + C::kLanes * j];
      }
    }
  }
  if (key >= g.time) return;
  Storage* out = dqkv + (sampleRow + key) * stride + h * g.headSize;
  COHORT_UNROLL
  for (int j = 0; j < C::kCols; ++j) {
    const int d = lane + C::kLanes * j;
    if (d >= g.headSize) continue;
    out[g.dim + d] = store<Storage>(dk[j] * g.scale);
    out[2 * g.dim + d] = store<Storage>(dv[j]);
  }
}

// dQ of one query tile, over the key tiles up to the diagonal (the last tiles first).
template <class Storage, int kHd>
__global__ void attentionQueryGradKernel(const Storage* __restrict__ qkv, const Storage* __restrict__ dy,
                                         const float* __restrict__ lse, const float* __restrict__ rowDot,
                                         Storage* __restrict__ dqkv, Geometry g) {
  using C = Tiles<kHd>;
  __shared__ float qTile[C::kRows][C::kStride], dyTile[C::kRows][C::kStride];
  __shared__ float kTile[C::kRows][C::kStride], vTile[C::kRows][C::kStride];
  __shared__ float dsTile[C::kRows][C::kRows + 1];  // [query][key]
  const int b = blockIdx.x / g.heads, h = blockIdx.x % g.heads, qBlock = gridDim.y - 1 - blockIdx.y;
  const int row = threadIdx.x / C::kLanes, lane = threadIdx.x % C::kLanes;
  const int first = qBlock * C::kRows, t = first + row;
  const int64_t stride = 3 * static_cast<int64_t>(g.dim), sampleRow = static_cast<int64_t>(b) * g.time;
  const Storage* sample = qkv + sampleRow * stride + h * g.headSize;
  loadTile<C>(qTile, sample, stride, first, g);
  loadTile<C>(dyTile, dy + sampleRow * g.dim + h * g.headSize, g.dim, first, g);
  const int64_t statAt = static_cast<int64_t>(blockIdx.x) * g.time + t;
  const float rowLse = t < g.time ? lse[statAt] : 0.0f, rowD = t < g.time ? rowDot[statAt] : 0.0f;
  float dq[C::kCols] = {};
  for (int kBlock = 0; kBlock <= qBlock; ++kBlock) {
    const int keyFirst = kBlock * C::kRows;
    __syncthreads();  // the previous key tile read
    loadTile<C>(kTile, sample + g.dim, stride, keyFirst, g);
    loadTile<C>(vTile, sample + 2 * g.dim, stride, keyFirst, g);
    __syncthreads();
    COHORT_UNROLL
    for (int i = 0; i < C::kPerLane; ++i) {
      const int c = lane + C::kLanes * i;
      float ds = 0.0f;
      if (keyFirst + c <= t && t < g.time) {
        const float p = expf(dot<C>(qTile[row], kTile[c]) * g.scale - rowLse);
        ds = p * (dot<C>(dyTile[row], vTile[c]) - rowD);
      }
      dsTile[row][c] = ds;
    }
    __syncthreads();
    for (int c = 0; c < C::kRows; ++c) {
      const float ds = dsTile[row][c];
      COHORT_UNROLL
      for (int j = 0; j < C::kCols; ++j) dq[j] += ds * kTile[c][lane + C::kLanes * j];
    }
  }
  if (t >= g.time) return;
  Storage* out = dqkv + (sampleRow + t) * stride + h * g.headSize;
  COHORT_UNROLL
  for (int j = 0; j < C::kCols; ++j) {
    const int d = lane + C::kLanes * j;
    if (d < g.headSize) out[d] = store<Storage>(dq[j] * g.scale);
  }
}

// The shape's checks and the kernels' view of it; InvalidArgument for a head size over the kernels'.
Geometry geometryOf(const AttentionShape& s) {
  COHORT_CHECK(s.batch >= 0 && s.time >= 1 && s.heads >= 1 && s.dim >= s.heads && s.dim % s.heads == 0)
      << "attention shape: batch " << s.batch << ", time " << s.time << ", heads " << s.heads << ", dim " << s.dim;
  const int64_t hd = s.dim / s.heads;
  if (hd > kAttentionMaxHeadSize) {
    COHORT_THROW(InvalidArgument) << "fused attention on a GPU takes heads of at most " << kAttentionMaxHeadSize
                                  << " features, got " << hd << " (width " << s.dim << ", " << s.heads << " heads)";
  }
  return {.time = static_cast<int>(s.time),
          .heads = static_cast<int>(s.heads),
          .headSize = static_cast<int>(hd),
          .dim = static_cast<int>(s.dim),
          .scale = 1.0f / std::sqrt(static_cast<float>(hd))};
}

// The tile grid of a bucket: (B·H, tiles of kRows positions).
template <int kHd>
dim3 tileGrid(const AttentionShape& s) {
  const int64_t tiles = (s.time + Tiles<kHd>::kRows - 1) / Tiles<kHd>::kRows;
  return dim3(static_cast<unsigned>(s.batch * s.heads), static_cast<unsigned>(tiles));
}

}  // namespace

void attentionForward(const AttentionForwardBuffers& b, const AttentionShape& s, const Stream& stream) {
  checkCudaStream(stream);
  const Geometry g = geometryOf(s);
  if (s.batch == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  const cudaStream_t native = nativeStream(stream);
  if (b.type == DType::kBF16) {  // tensor cores
    attention::forwardMma(b.qkv, b.y, b.lse, g, s.batch, native);
  } else {
    COHORT_CHECK(b.type == DType::kF32);
    attention::forBucket(g.headSize, [&](auto bucket) {
      constexpr int kHd = decltype(bucket)::value;
      COHORT_LAUNCH((attentionForwardKernel<float, kHd>), tileGrid<kHd>(s), kThreads, 0, native)(
          static_cast<const float*>(b.qkv), static_cast<float*>(b.y), b.lse, g);
    });
  }
  COHORT_CUDA_CHECK(cudaGetLastError());
}

size_t attentionBackwardScratchBytes(const AttentionShape& s, DType type) {
  if (type != DType::kBF16) return 0;
  const Geometry g = geometryOf(s);
  return bf16AttentionScratchBytes({.batch = s.batch, .heads = g.heads, .time = g.time, .headSize = g.headSize});
}

void attentionBackward(const AttentionBackwardBuffers& b, const AttentionShape& s, const Stream& stream) {
  checkCudaStream(stream);
  const Geometry g = geometryOf(s);
  if (s.batch == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  const cudaStream_t native = nativeStream(stream);
  const int64_t rows = s.batch * s.heads * s.time;
  const unsigned dotBlocks = blocksFor(stream, static_cast<size_t>(rows), kWarpsPerBlock);
  elements::dispatch(b.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    COHORT_LAUNCH(attentionRowDotKernel<T>, dotBlocks, kThreads, 0, native)(
        static_cast<const T*>(b.y), static_cast<const T*>(b.dy), b.rowDot, g, rows);
  });
  if (b.type == DType::kBF16) {  // tensor cores, dS formed once (attention_mma_backward.cu)
    COHORT_CHECK(b.scratch != nullptr) << "bf16 attention backward without its scratch";
    attention::backwardMma(
        {.qkv = b.qkv, .dy = b.dy, .lse = b.lse, .rowDot = b.rowDot, .dqkv = b.dqkv, .dsScratch = b.scratch}, g,
        s.batch, native);
  } else {
    const auto* qkv = static_cast<const float*>(b.qkv);
    const auto* dy = static_cast<const float*>(b.dy);
    auto* dqkv = static_cast<float*>(b.dqkv);
    attention::forBucket(g.headSize, [&](auto bucket) {
      constexpr int kHd = decltype(bucket)::value;
      const dim3 grid = tileGrid<kHd>(s);
      COHORT_LAUNCH((attentionKeyGradKernel<float, kHd>), grid, kThreads, 0, native)(qkv, dy, b.lse, b.rowDot, dqkv, g);
      COHORT_LAUNCH((attentionQueryGradKernel<float, kHd>), grid, kThreads, 0, native)(qkv, dy, b.lse, b.rowDot, dqkv,
                                                                                      g);
    });
  }
  COHORT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cohort::runtime::cuda
