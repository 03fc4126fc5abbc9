// The kernels of runtime/cuda/norm_kernels.h.
//
// GELU is a flat grid-stride kernel that moves four elements per access (float4, or 8 bytes of
// bf16) when every buffer is aligned to that, like the activations of kernels.cu. LayerNorm's row
// kernels give each row a row group (a warp for rows of at most kWarpRowMaxCols columns, else the
// whole block), as kernels.cu's softmax does; the group's partial sums meet through warp shuffles
// (and, for a block, one pass through shared memory), so every thread of the group ends with the
// same bits and the row loop is uniform over the group. A row moves in 16-byte accesses and stays
// in registers between its passes (see "LayerNorm" below). The parameter gradients are column
// sums: see layerNormBackward in the header for their two fixed-order stages.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/elements.h"
#include "runtime/cuda/launch.h"
#include "runtime/cuda/norm_kernels.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {
namespace {

using namespace launch;  // kThreads, kWarpSize, blocksFor, firstIndex, RowGroup, groupReduce, ... (launch.h)

// ---- GELU ----

// nn/gelu.cc's constants and operation order.
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__device__ __forceinline__ float geluValue(float x) {
  const float t = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
  return 0.5f * x * (1.0f + t);
}

__device__ __forceinline__ float geluGrad(float x, float dy) {
  const float t = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
  return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}

using elements::Bf16Eight;
using elements::load;
using elements::loadQuad;
using elements::quadsFor;
using elements::store;
using elements::storeQuad;

// Elements [0, 4 · quads) four at a time, the rest one by one. x may equal y.
template <class T>
__global__ void geluForwardKernel(const T* x, T* y, size_t n, size_t quads) {
  for (size_t i = firstIndex(); i < quads; i += gridStride()) {
    const float4 v = loadQuad(x, i);
    storeQuad(y, i, make_float4(geluValue(v.x), geluValue(v.y), geluValue(v.z), geluValue(v.w)));
  }
  for (size_t i = 4 * quads + firstIndex(); i < n; i += gridStride()) y[i] = store<T>(geluValue(load(x[i])));
}

// dx has x's type. dy may equal dx.
template <class TX, class TDY>
__global__ void geluBackwardKernel(const TX* x, const TDY* dy, TX* dx, size_t n, size_t quads) {
  for (size_t i = firstIndex(); i < quads; i += gridStride()) {
    const float4 v = loadQuad(x, i);
    const float4 g = loadQuad(dy, i);
    storeQuad(dx, i, make_float4(geluGrad(v.x, g.x), geluGrad(v.y, g.y), geluGrad(v.z, g.z), geluGrad(v.w, g.w)));
  }
  for (size_t i = 4 * quads + firstIndex(); i < n; i += gridStride()) {
    dx[i] = store<TX>(geluGrad(load(x[i]), load(dy[i])));
  }
}

// ---- LayerNorm ----
//
// The row kernels move a row in chunks of kChunk = 8 consecutive elements: one 16-byte access of
// bf16 (two of fp32) when every buffer of the row is 16-byte aligned (checked per row, so a width
// that is not a multiple of 8 still gets them on the rows that allow) and the chunk lies inside
// the row; otherwise element by element (the scalar tail). Thread `lane` of a row group of kWidth
// threads takes chunks lane, lane + kWidth, ... of its row; the first kHeld of them stay in
// registers between the passes over the row, so the row is read once. Only a block's row wider
// than kWidth · kChunk · kHeldMax (8192 columns) reads its remaining chunks again.

constexpr int kChunk = 8;
constexpr int kHeldMax = 4;

__device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// v = elements [c, c + kChunk) of row, 0 past cols.
__device__ __forceinline__ void loadChunk(const float* row, int64_t c, int64_t cols, bool vec, float (&v)[kChunk]) {
  if (vec && c + kChunk <= cols) {
    const float4 lo = reinterpret_cast<const float4*>(row + c)[0], hi = reinterpret_cast<const float4*>(row + c)[1];
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    return;
  }
#pragma unroll
  for (int i = 0; i < kChunk; ++i) v[i] = c + i < cols ? row[c + i] : 0.0f;
}

__device__ __forceinline__ void loadChunk(const __nv_bfloat16* row, int64_t c, int64_t cols, bool vec,
                                          float (&v)[kChunk]) {
  if (vec && c + kChunk <= cols) {
    const Bf16Eight e = *reinterpret_cast<const Bf16Eight*>(row + c);
#pragma unroll
    for (int i = 0; i < kChunk / 2; ++i) {
      const float2 f = __bfloat1622float2(e.pair[i]);
      v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kChunk; ++i) v[i] = c + i < cols ? load(row[c + i]) : 0.0f;
}

// Elements [c, c + kChunk) of row = v, those before cols.
__device__ __forceinline__ void storeChunk(float* row, int64_t c, int64_t cols, bool vec, const float (&v)[kChunk]) {
  if (vec && c + kChunk <= cols) {
    reinterpret_cast<float4*>(row + c)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(row + c)[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    if (c + i < cols) row[c + i] = v[i];
  }
}

__device__ __forceinline__ void storeChunk(__nv_bfloat16* row, int64_t c, int64_t cols, bool vec,
                                           const float (&v)[kChunk]) {
  if (vec && c + kChunk <= cols) {
    Bf16Eight e;
#pragma unroll
    for (int i = 0; i < kChunk / 2; ++i) e.pair[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<Bf16Eight*>(row + c) = e;
    return;
  }
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    if (c + i < cols) row[c + i] = store<__nv_bfloat16>(v[i]);
  }
}

// The forward's row r: the input x (and, fused, the branch added to it and the sum written), the
// output y; whether every one of them allows 16-byte accesses.
template <class TX, class TB, class TY>
struct ForwardRow {
  const TX* x;
  const TB* branch;  // null: not fused
  float* sum;
  TY* y;
  bool vec;

  // v = chunk c of the input (x + branch, written to sum); returns its elements' total.
  __device__ double load(int64_t c, int64_t cols, float (&v)[kChunk]) const {
    loadChunk(x, c, cols, vec, v);
    if (branch != nullptr) {
      float b[kChunk];
      loadChunk(branch, c, cols, vec, b);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) v[i] += b[i];
      storeChunk(sum, c, cols, vec, v);
    }
    double total = 0.0;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) total += v[i];  // 0 past cols
    return total;
  }
  // Chunk c of the input again (the sum this thread wrote, when fused).
  __device__ void reload(int64_t c, int64_t cols, float (&v)[kChunk]) const {
    if (branch != nullptr) return loadChunk(sum, c, cols, vec, v);
    loadChunk(x, c, cols, vec, v);
  }
};

__device__ __forceinline__ double squaredDeviations(const float (&v)[kChunk], int64_t c, int64_t cols, double mu) {
  double sq = 0.0;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    const double d = v[i] - mu;
    if (c + i < cols) sq += d * d;
  }
  return sq;
}

// y = weight · ((v − mean) · rstd) + bias over chunk c.
template <class TY>
__device__ __forceinline__ void normalizeChunk(float (&v)[kChunk], const float* weight, const float* bias, TY* y,
                                               int64_t c, int64_t cols, bool vec, float meanF, float inv) {
  float w[kChunk], b[kChunk];
  loadChunk(weight, c, cols, vec, w);
  loadChunk(bias, c, cols, vec, b);
#pragma unroll
  for (int i = 0; i < kChunk; ++i) v[i] = w[i] * ((v[i] - meanF) * inv) + b[i];
  storeChunk(y, c, cols, vec, v);
}

// As nn::LayerNorm::forward, one row per group, of x or (fused) of x + branch, which it writes to
// sum. x may equal sum: each element is read before the thread that reads it writes it.
template <unsigned kWidth, class TX, class TB, class TY>
__global__ void layerNormForwardKernel(const TX* x, const TB* branch, float* sum, const float* __restrict__ weight,
                                       const float* __restrict__ bias, TY* __restrict__ y, float* __restrict__ mean,
                                       float* __restrict__ rstd, int64_t rows, int64_t cols, double eps) {
  using G = RowGroup<kWidth>;
  constexpr int64_t kSpan = static_cast<int64_t>(kWidth) * kChunk;
  const int64_t first = static_cast<int64_t>(G::lane()) * kChunk;
  const bool paramsVec = aligned16(weight) && aligned16(bias);
  for (int64_t r = G::firstRow(); r < rows; r += G::rowStride()) {
    const bool fused = branch != nullptr;
    const TX* xr = x + r * cols;
    const TB* br = fused ? branch + r * cols : nullptr;
    float* sr = fused ? sum + r * cols : nullptr;
    TY* yr = y + r * cols;
    const bool vec = paramsVec && aligned16(xr) && aligned16(yr) && (!fused || (aligned16(br) && aligned16(sr)));
    const ForwardRow<TX, TB, TY> row{xr, br, sr, yr, vec};
    float v[kHeldMax][kChunk], t[kChunk];
    double total = 0.0;
#pragma unroll
    for (int k = 0; k < kHeldMax; ++k) {
      if (first + k * kSpan < cols) total += row.load(first + k * kSpan, cols, v[k]);
    }
    for (int64_t c = first + kHeldMax * kSpan; c < cols; c += kSpan) total += row.load(c, cols, t);
    const double mu = groupReduce<kWidth>(total, SumOp{}) / static_cast<double>(cols);
    double sq = 0.0;
#pragma unroll
    for (int k = 0; k < kHeldMax; ++k) {
      if (first + k * kSpan < cols) sq += squaredDeviations(v[k], first + k * kSpan, cols, mu);
    }
    for (int64_t c = first + kHeldMax * kSpan; c < cols; c += kSpan) {
      row.reload(c, cols, t);
      sq += squaredDeviations(t, c, cols, mu);
    }
    const double var = groupReduce<kWidth>(sq, SumOp{}) / static_cast<double>(cols);
    const float meanF = static_cast<float>(mu);
    const float inv = static_cast<float>(1.0 / sqrt(var + eps));
    if (G::lane() == 0) {
      mean[r] = meanF;
      rstd[r] = inv;
    }
#pragma unroll
    for (int k = 0; k < kHeldMax; ++k) {
      if (first + k * kSpan < cols) normalizeChunk(v[k], weight, bias, row.y, first + k * kSpan, cols, row.vec, meanF, inv);
    }
    for (int64_t c = first + kHeldMax * kSpan; c < cols; c += kSpan) {
      row.reload(c, cols, t);
      normalizeChunk(t, weight, bias, row.y, c, cols, row.vec, meanF, inv);
    }
  }
}

// What layerNormBackwardKernel reads and writes (norm_kernels.h's LayerNormBackwardBuffers, typed).
template <class TDY, class TX>
struct BackwardArgs {
  const TDY* dy;
  const TX* x;
  const float *weight, *mean, *rstd;
  const float* residualGrad;  // or null; may equal dx
  TX* dx;                     // or null
  __nv_bfloat16* dx16;        // or null
  float *partialW, *partialB;  // [chunks, cols]
  int64_t rows, cols, chunkRows;
};

// Chunk c of one row of the backward: g = dy · weight and xhat = (x − mean) · rstd into g and xh;
// dy · xhat and dy added to accW and accB; returns Σ g and Σ g · xhat through sumG and sumGXhat.
template <class TDY, class TX>
__device__ __forceinline__ void gradChunk(const TDY* dyr, const TX* xr, const float* weight, int64_t c, int64_t cols,
                                          bool vec, float meanF, float inv, float (&g)[kChunk], float (&xh)[kChunk],
                                          float (&accW)[kChunk], float (&accB)[kChunk], double& sumG,
                                          double& sumGXhat) {
  float d[kChunk], w[kChunk];
  loadChunk(dyr, c, cols, vec, d);
  loadChunk(xr, c, cols, vec, xh);
  loadChunk(weight, c, cols, vec, w);
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    xh[i] = (xh[i] - meanF) * inv;
    g[i] = d[i] * w[i];  // 0 past cols, as d
    accW[i] += d[i] * xh[i];
    accB[i] += d[i];
    sumG += g[i];
    sumGXhat += static_cast<double>(g[i]) * xh[i];
  }
}

// dx = residualGrad + rstd · (g − mean(g) − xhat · mean(g · xhat)) over chunk c, and its bf16 copy.
template <class TDY, class TX>
__device__ __forceinline__ void inputGradChunk(const BackwardArgs<TDY, TX>& a, int64_t r, int64_t c, bool vec,
                                               const float (&g)[kChunk], const float (&xh)[kChunk], float inv,
                                               float meanG, float meanGXhat) {
  float out[kChunk];
#pragma unroll
  for (int i = 0; i < kChunk; ++i) out[i] = inv * (g[i] - meanG - xh[i] * meanGXhat);
  if (a.residualGrad != nullptr) {
    float res[kChunk];
    loadChunk(a.residualGrad + r * a.cols, c, a.cols, vec, res);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) out[i] = res[i] + out[i];
  }
  storeChunk(a.dx + r * a.cols, c, a.cols, vec, out);
  if (a.dx16 != nullptr) storeChunk(a.dx16 + r * a.cols, c, a.cols, vec, out);
}

// The block's column sums into its rows of partialW and partialB. A warp per row: the block's
// warps' sums are added in warp order through shared memory; a block per row: each thread owns
// its columns (those past the held chunks it has written there already).
template <unsigned kWidth, int kHeld, class TDY, class TX>
__device__ void writeColumnPartials(const BackwardArgs<TDY, TX>& a, const float (&accW)[kHeld][kChunk],
                                    const float (&accB)[kHeld][kChunk]) {
  using G = RowGroup<kWidth>;
  constexpr int64_t kSpan = static_cast<int64_t>(kWidth) * kChunk;
  const int64_t first = static_cast<int64_t>(G::lane()) * kChunk, cols = a.cols;
  float* pw = a.partialW + static_cast<int64_t>(blockIdx.x) * cols;
  float* pb = a.partialB + static_cast<int64_t>(blockIdx.x) * cols;
  if constexpr (kWidth == kWarpSize) {
    __shared__ float sumW[kWarpRowMaxCols], sumB[kWarpRowMaxCols];
    for (unsigned w = 0; w < G::kRowsPerBlock; ++w) {
      if (G::groupInBlock() == w) {
#pragma unroll
        for (int k = 0; k < kHeld; ++k) {
#pragma unroll
          for (int i = 0; i < kChunk; ++i) {
            const int64_t c = first + k * kSpan + i;
            if (c >= cols) continue;
            sumW[c] = w == 0 ? accW[k][i] : sumW[c] + accW[k][i];
            sumB[c] = w == 0 ? accB[k][i] : sumB[c] + accB[k][i];
          }
        }
      }
      __syncthreads();
    }
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      pw[c] = sumW[c];
      pb[c] = sumB[c];
    }
  } else {
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      const int64_t c = first + k * kSpan;
      if (c >= cols) continue;
      storeChunk(pw, c, cols, false, accW[k]);
      storeChunk(pb, c, cols, false, accB[k]);
    }
  }
}

// One chunk of rows per block, [blockIdx.x · chunkRows, + chunkRows), its rows dealt to the
// block's row groups in turn. Per row, nn::LayerNorm::backward's input gradient plus the residual
// gradient (dx, and dx16), from dy and x read once; the block's column sums of dy · xhat and dy
// go to its rows of the partials. A warp's row (at most kWarpRowMaxCols columns) is held whole
// (kHeld = its chunks per lane); a block's wider than kHeld chunks per thread reads the rest again
// and sums its columns straight into its rows of the partials.
template <unsigned kWidth, int kHeld, class TDY, class TX>
__global__ void layerNormBackwardKernel(BackwardArgs<TDY, TX> a) {
  using G = RowGroup<kWidth>;
  constexpr int64_t kSpan = static_cast<int64_t>(kWidth) * kChunk;
  const int64_t first = static_cast<int64_t>(G::lane()) * kChunk, cols = a.cols;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * a.chunkRows;
  const int64_t end = begin + a.chunkRows < a.rows ? begin + a.chunkRows : a.rows;
  float* pw = a.partialW + static_cast<int64_t>(blockIdx.x) * cols;
  float* pb = a.partialB + static_cast<int64_t>(blockIdx.x) * cols;
  float accW[kHeld][kChunk] = {}, accB[kHeld][kChunk] = {};
  for (int64_t r = begin + G::groupInBlock(); r < end; r += G::kRowsPerBlock) {
    const TDY* dyr = a.dy + r * cols;
    const TX* xr = a.x + r * cols;
    const bool vec = aligned16(dyr) && aligned16(xr) && aligned16(a.weight) &&
                     (a.residualGrad == nullptr || aligned16(a.residualGrad + r * cols)) &&
                     (a.dx == nullptr || aligned16(a.dx + r * cols)) && (a.dx16 == nullptr || aligned16(a.dx16 + r * cols));
    const float meanF = a.mean[r], inv = a.rstd[r];
    float g[kHeld][kChunk], xh[kHeld][kChunk], tg[kChunk], txh[kChunk], tw[kChunk], tb[kChunk];
    double sumG = 0.0, sumGXhat = 0.0;
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      const int64_t c = first + k * kSpan;
      if (c < cols) gradChunk(dyr, xr, a.weight, c, cols, vec, meanF, inv, g[k], xh[k], accW[k], accB[k], sumG, sumGXhat);
    }
    for (int64_t c = first + kHeld * kSpan; c < cols; c += kSpan) {  // a block's row past 8192 columns
#pragma unroll
      for (int i = 0; i < kChunk; ++i) tw[i] = tb[i] = 0.0f;
      gradChunk(dyr, xr, a.weight, c, cols, false, meanF, inv, tg, txh, tw, tb, sumG, sumGXhat);
      for (int i = 0; i < kChunk && c + i < cols; ++i) {
        pw[c + i] = r == begin ? tw[i] : pw[c + i] + tw[i];
        pb[c + i] = r == begin ? tb[i] : pb[c + i] + tb[i];
      }
    }
    const float meanG = static_cast<float>(groupReduce<kWidth>(sumG, SumOp{}) / static_cast<double>(cols));
    const float meanGXhat = static_cast<float>(groupReduce<kWidth>(sumGXhat, SumOp{}) / static_cast<double>(cols));
    if (a.dx == nullptr) continue;
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      const int64_t c = first + k * kSpan;
      if (c < cols) inputGradChunk(a, r, c, vec, g[k], xh[k], inv, meanG, meanGXhat);
    }
    for (int64_t c = first + kHeld * kSpan; c < cols; c += kSpan) {
      double unused = 0.0;
      gradChunk(dyr, xr, a.weight, c, cols, false, meanF, inv, tg, txh, tw, tb, unused, unused);
      inputGradChunk(a, r, c, vec, tg, txh, inv, meanG, meanGXhat);
    }
  }
  writeColumnPartials<kWidth, kHeld>(a, accW, accB);
}

// Rows per chunk (a block of layerNormBackwardKernel) of the parameter-gradient reduction: at
// least kMinChunkRows (work per row group), more once a chunk count would pass kMaxChunks (bounded
// scratch and second stage). Both depend only on the row count, so the order of additions does too.
constexpr int64_t kMinChunkRows = 32;
constexpr int64_t kMaxChunks = 512;

int64_t chunkRowsFor(int64_t rows) { return std::max(kMinChunkRows, (rows + kMaxChunks - 1) / kMaxChunks); }
int64_t chunksFor(int64_t rows) { return (rows + chunkRowsFor(rows) - 1) / chunkRowsFor(rows); }

// Stage 2: a warp per column; lane k adds the column's chunk partials k, k + 32, ... in double, the
// warp's butterfly adds the lanes' sums (none: 0), so the order depends only on the chunk count.
__global__ void layerNormParamReduceKernel(const float* __restrict__ partialW, const float* __restrict__ partialB,
                                           float* __restrict__ dweight, float* __restrict__ dbias, int64_t chunks,
                                           int64_t cols, bool accumulate) {
  const unsigned lane = threadIdx.x % kWarpSize;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize; c < cols; c += warps) {
    double totalW = 0.0, totalB = 0.0;
    for (int64_t k = lane; k < chunks; k += kWarpSize) {
      totalW += partialW[k * cols + c];
      totalB += partialB[k * cols + c];
    }
    totalW = groupReduce<kWarpSize>(totalW, SumOp{});
    totalB = groupReduce<kWarpSize>(totalB, SumOp{});
    if (lane != 0) continue;
    dweight[c] = accumulate ? dweight[c] + static_cast<float>(totalW) : static_cast<float>(totalW);
    dbias[c] = accumulate ? dbias[c] + static_cast<float>(totalB) : static_cast<float>(totalB);
  }
}

void checkShape(const LayerNormOptions& o) {
  COHORT_CHECK(o.rows >= 0 && o.cols >= 1) << "LayerNorm of " << o.rows << " x " << o.cols;
}

}  // namespace

void geluForward(const void* x, void* y, int64_t n, const Stream& stream, DType type) {
  checkCudaStream(stream);
  COHORT_CHECK(n >= 0) << n;
  if (n == 0) return;
  const size_t count = static_cast<size_t>(n);
  const size_t quads = quadsFor(count, {{x, type}, {y, type}});
  CudaDeviceGuard guard(stream.device().index);
  const unsigned blocks = blocksFor(stream, quads > 0 ? quads + count % 4 : count);
  elements::dispatch(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    COHORT_LAUNCH(geluForwardKernel<T>, blocks, kThreads, 0, nativeStream(stream))(
        static_cast<const T*>(x), static_cast<T*>(y), count, quads);
  });
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void geluBackward(const void* x, const void* dy, void* dx, int64_t n, const Stream& stream, DType xType,
                  DType dyType) {
  checkCudaStream(stream);
  COHORT_CHECK(n >= 0) << n;
  if (n == 0) return;
  const size_t count = static_cast<size_t>(n);
  const size_t quads = quadsFor(count, {{x, xType}, {dy, dyType}, {dx, xType}});
  CudaDeviceGuard guard(stream.device().index);
  const unsigned blocks = blocksFor(stream, quads > 0 ? quads + count % 4 : count);
  elements::dispatch(xType, [&](auto xTag) {
    elements::dispatch(dyType, [&](auto dyTag) {
      using TX = typename decltype(xTag)::type;
      using TDY = typename decltype(dyTag)::type;
      COHORT_LAUNCH((geluBackwardKernel<TX, TDY>), blocks, kThreads, 0, nativeStream(stream))(
          static_cast<const TX*>(x), static_cast<const TDY*>(dy), static_cast<TX*>(dx), count, quads);
    });
  });
  COHORT_CUDA_CHECK(cudaGetLastError());
}

namespace {

// The forward's kernel for a row group of kWidth threads, its types from the buffers' DTypes.
template <unsigned kWidth>
void launchLayerNormForward(const LayerNormForwardBuffers& b, const LayerNormOptions& o, const Stream& stream) {
  const unsigned blocks = rowBlocks(stream, o.rows, o.cols);
  elements::dispatch(b.xType, [&](auto xTag) {
    elements::dispatch(b.branch != nullptr ? b.branchType : b.xType, [&](auto branchTag) {
      elements::dispatch(b.yType, [&](auto yTag) {
        using TX = typename decltype(xTag)::type;
        using TB = typename decltype(branchTag)::type;
        using TY = typename decltype(yTag)::type;
        COHORT_LAUNCH((layerNormForwardKernel<kWidth, TX, TB, TY>), blocks, kThreads, 0, nativeStream(stream))(
            static_cast<const TX*>(b.x), static_cast<const TB*>(b.branch), b.sum, b.weight, b.bias,
            static_cast<TY*>(b.y), b.mean, b.rstd, o.rows, o.cols, o.eps);
      });
    });
  });
}

// The backward's row kernel for a row group of kWidth threads holding kHeld chunks each.
template <unsigned kWidth, int kHeld, class TDY, class TX>
void launchLayerNormBackward(const BackwardArgs<TDY, TX>& args, int64_t chunks, const Stream& stream) {
  COHORT_LAUNCH((layerNormBackwardKernel<kWidth, kHeld, TDY, TX>), static_cast<unsigned>(chunks), kThreads, 0,
                nativeStream(stream))(args);
}

// A warp's row is held whole: kHeld, its chunks per lane, is the fewest that cover it.
template <class TDY, class TX>
void launchLayerNormBackward(const BackwardArgs<TDY, TX>& args, int64_t chunks, const Stream& stream) {
  const int64_t perLane = (args.cols + kWarpSize * kChunk - 1) / (kWarpSize * kChunk);
  if (!warpPerRow(args.cols)) return launchLayerNormBackward<kThreads, kHeldMax>(args, chunks, stream);
  if (perLane <= 1) return launchLayerNormBackward<kWarpSize, 1>(args, chunks, stream);
  if (perLane <= 2) return launchLayerNormBackward<kWarpSize, 2>(args, chunks, stream);
  if (perLane <= 3) return launchLayerNormBackward<kWarpSize, 3>(args, chunks, stream);
  launchLayerNormBackward<kWarpSize, kHeldMax>(args, chunks, stream);
}

}  // namespace

void layerNormForward(const LayerNormForwardBuffers& b, const LayerNormOptions& o, const Stream& stream) {
  checkCudaStream(stream);
  checkShape(o);
  COHORT_CHECK(b.branch == nullptr || (b.sum != nullptr && b.xType == DType::kF32))
      << "a fused add's LayerNorm needs an fp32 input and a sum to write";
  if (o.rows == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  if (warpPerRow(o.cols)) {
    launchLayerNormForward<kWarpSize>(b, o, stream);
  } else {
    launchLayerNormForward<kThreads>(b, o, stream);
  }
  COHORT_CUDA_CHECK(cudaGetLastError());
}

int64_t layerNormScratchFloats(int64_t rows, int64_t cols) {
  COHORT_CHECK(rows >= 0 && cols >= 0) << rows << " x " << cols;
  return rows == 0 ? 0 : 2 * chunksFor(rows) * cols;
}

void layerNormBackward(const LayerNormBackwardBuffers& b, const LayerNormOptions& o, const Stream& stream) {
  checkCudaStream(stream);
  checkShape(o);
  COHORT_CHECK(b.dx != nullptr || (b.residualGrad == nullptr && b.dx16 == nullptr))
      << "LayerNorm's backward adds a residual gradient or writes a bf16 copy only with an input gradient";
  // With no rows the sums are 0: the reduction still runs to write them unless it would add nothing.
  if (o.rows == 0 && o.accumulate) return;
  CudaDeviceGuard guard(stream.device().index);
  const int64_t chunks = o.rows == 0 ? 0 : chunksFor(o.rows);
  float* partialW = b.scratch;
  float* partialB = b.scratch + chunks * o.cols;
  if (chunks > 0) {
    elements::dispatch(b.dyType, [&](auto dyTag) {
      elements::dispatch(b.xType, [&](auto xTag) {
        using TDY = typename decltype(dyTag)::type;
        using TX = typename decltype(xTag)::type;
        const BackwardArgs<TDY, TX> args{.dy = static_cast<const TDY*>(b.dy),
                                         .x = static_cast<const TX*>(b.x),
                                         .weight = b.weight,
                                         .mean = b.mean,
                                         .rstd = b.rstd,
                                         .residualGrad = b.residualGrad,
                                         .dx = static_cast<TX*>(b.dx),
                                         .dx16 = static_cast<__nv_bfloat16*>(b.dx16),
                                         .partialW = partialW,
                                         .partialB = partialB,
                                         .rows = o.rows,
                                         .cols = o.cols,
                                         .chunkRows = chunkRowsFor(o.rows)};
        launchLayerNormBackward(args, chunks, stream);
      });
    });
    COHORT_CUDA_CHECK(cudaGetLastError());
  }
  const unsigned reduceBlocks = blocksFor(stream, static_cast<size_t>(o.cols), kWarpsPerBlock);
  COHORT_LAUNCH(layerNormParamReduceKernel, reduceBlocks, kThreads, 0, nativeStream(stream))(
      partialW, partialB, b.dweight, b.dbias, chunks, o.cols, o.accumulate);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cohort::runtime::cuda
