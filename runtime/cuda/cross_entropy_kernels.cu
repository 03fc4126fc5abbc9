// softmaxCrossEntropy of runtime/cuda/kernels.h: the fused softmax, loss, accuracy and gradient.
//
// The algorithm (llm.c's fused classifier, in two passes over a row instead of three). A row group
// (launch.h: a warp when the row has at most kWarpRowMaxCols columns, else a block) owns a row:
//   pass 1: each lane walks its columns once, keeping a running maximum m, the sum s of exp(x − m)
//           (multiplied by exp(m_old − m) whenever m grows) and the first column holding m; the
//           group merges its lanes' (m, s, column) in a fixed order, so every lane ends with the
//           same bits. A −inf logit (a padded vocabulary's column) adds exactly 0 and never wins.
//   pass 2: grad[c] = exp(x[c] − m) / (s · rows), less 1/rows at the label. Each element is read
//           and written by the same thread, and the label's logit is read before the barrier that
//           ends pass 1, so grad may be the logits themselves (written in place: the caller's
//           opt-in, for logits nobody reads after the loss).
// Both passes move a lane's columns in packs of 8 (one 16-byte access of bf16, two of fp32) when the
// row starts aligned and its width is a multiple of 8; else one element at a time. The pack is 8
// columns whatever the type, so bf16 logits and their fp32 widening split a row among the lanes
// alike and give the same bits.
//
// The sums. Each row writes {loss, status} to rowResults[r]; crossEntropySumKernel, one block, adds
// them in an order fixed by the row count alone (thread t takes rows t, t + kThreads, ..., then a
// fixed tree), in double, and adds the totals to the device scalars with one thread. No float
// atomics: the same logits give the same bits on every run and every device.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/elements.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/launch.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {
namespace {

using namespace launch;  // kThreads, RowGroup, rowBlocks, blockSum, ... (launch.h)

// rowResults' status: what the row's prediction was.
constexpr float kMissed = 0.0f, kHit = 1.0f, kBadTarget = 2.0f;

// Columns a lane moves at a time on the packed path: 16 bytes of bf16, 32 of fp32.
constexpr int kPack = 8;

template <class T, int N>
struct alignas(N * sizeof(T)) Pack {
  T v[N];
};

// A lane's view of its row: the running maximum, the sum of exp(x − max), the first column of max.
struct Online {
  float max;
  float sum;
  int64_t index;
};

__device__ __forceinline__ void add(Online& s, float x, int64_t c) {
  if (x > s.max) {
    s.sum = s.sum * expf(s.max - x) + 1.0f;  // exp(−inf) = 0 while nothing is summed yet
    s.max = x;
    s.index = c;
  } else if (x != -INFINITY) {
    s.sum += expf(x - s.max);
  }
}

// Commutative bit for bit (the butterfly gives both partners the same result): max and the first
// index are symmetric, and the sum adds two terms. A max is never NaN (add skips NaN as a maximum).
__device__ __forceinline__ Online merge(Online a, Online b) {
  const float mx = b.max > a.max ? b.max : a.max;
  if (mx == -INFINITY) return {mx, 0.0f, a.index < b.index ? a.index : b.index};
  const float sum = (a.max == -INFINITY ? 0.0f : a.sum * expf(a.max - mx)) +
                    (b.max == -INFINITY ? 0.0f : b.sum * expf(b.max - mx));
  const bool takeB = b.max > a.max || (b.max == a.max && b.index < a.index);
  return {mx, sum, takeB ? b.index : a.index};
}

// The group's merge of its lanes' states: a warp's xor butterfly, then (a block) its warps' results
// in warp order, the same in every thread. Ends with a barrier of the group: pass 2 may write.
template <unsigned kWidth>
__device__ Online groupMerge(Online v) {
  for (unsigned offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const Online other{__shfl_xor_sync(kFullMask, v.max, offset), __shfl_xor_sync(kFullMask, v.sum, offset),
                       __shfl_xor_sync(kFullMask, v.index, offset)};
    v = merge(v, other);
  }
  if constexpr (kWidth == kWarpSize) {
    __syncwarp();
    return v;
  } else {
    __shared__ Online perWarp[kWarpsPerBlock];
    __syncthreads();  // the previous row's readers are done with perWarp
    if (threadIdx.x % kWarpSize == 0) perWarp[threadIdx.x / kWarpSize] = v;
    __syncthreads();
    Online total = perWarp[0];
    for (unsigned w = 1; w < kWarpsPerBlock; ++w) total = merge(total, perWarp[w]);
    return total;
  }
}

// f(c, x[c]) for the lane's columns of a row, in increasing column order: packs of kPack when
// `packed`, else columns lane, lane + kWidth, ...
template <unsigned kWidth, class TX, class F>
__device__ __forceinline__ void forEachColumn(const TX* x, int64_t cols, bool packed, F&& f) {
  if (packed) {
    for (int64_t p = RowGroup<kWidth>::lane(); p < cols / kPack; p += kWidth) {
      const Pack<TX, kPack> in = reinterpret_cast<const Pack<TX, kPack>*>(x)[p];
      for (int j = 0; j < kPack; ++j) f(p * kPack + j, elements::load(in.v[j]));
    }
  } else {
    for (int64_t c = RowGroup<kWidth>::lane(); c < cols; c += kWidth) f(c, elements::load(x[c]));
  }
}

// g[c] = f(c, x[c]) over the lane's columns, with forEachColumn's column split (x may equal g).
template <unsigned kWidth, class TX, class TG, class F>
__device__ __forceinline__ void mapColumns(const TX* x, TG* g, int64_t cols, bool packed, F&& f) {
  if (packed) {
    for (int64_t p = RowGroup<kWidth>::lane(); p < cols / kPack; p += kWidth) {
      const Pack<TX, kPack> in = reinterpret_cast<const Pack<TX, kPack>*>(x)[p];
      Pack<TG, kPack> out;
      for (int j = 0; j < kPack; ++j) out.v[j] = elements::store<TG>(f(p * kPack + j, elements::load(in.v[j])));
      reinterpret_cast<Pack<TG, kPack>*>(g)[p] = out;
    }
  } else {
    for (int64_t c = RowGroup<kWidth>::lane(); c < cols; c += kWidth) g[c] = elements::store<TG>(f(c, elements::load(x[c])));
  }
}

// As nn::SoftmaxCrossEntropy::forward, with bad targets flagged instead of thrown (their gradient
// rows 0). `logits` and `grad` may be the same memory (then TX is TG).
template <unsigned kWidth, class TX, class TG>
__global__ void softmaxCrossEntropyKernel(const TX* logits, const float* __restrict__ targets, TG* grad, int64_t rows,
                                          int64_t cols, bool packed, float invRows, float2* __restrict__ rowResults) {
  using G = RowGroup<kWidth>;
  for (int64_t r = G::firstRow(); r < rows; r += G::rowStride()) {
    const TX* x = logits + r * cols;
    TG* g = grad + r * cols;
    const float t = targets[r];
    // The same for the whole group, so `continue` keeps the group together.
    if (!(t >= 0.0f && t < static_cast<float>(cols) && truncf(t) == t)) {
      mapColumns<kWidth>(x, g, cols, packed, [](int64_t, float) { return 0.0f; });
      if (G::lane() == 0) rowResults[r] = make_float2(0.0f, kBadTarget);
      continue;
    }
    const int64_t label = static_cast<int64_t>(t);
    const float labelLogit = G::lane() == 0 ? elements::load(x[label]) : 0.0f;  // before pass 2 may overwrite it
    Online s{-INFINITY, 0.0f, INT64_MAX};  // a lane without columns never wins
    forEachColumn<kWidth>(x, cols, packed, [&](int64_t c, float v) { add(s, v, c); });
    s = groupMerge<kWidth>(s);
    const float mx = s.max, scale = invRows / s.sum;
    mapColumns<kWidth>(x, g, cols, packed, [&](int64_t c, float v) {
      const float p = expf(v - mx) * scale;
      return c == label ? p - invRows : p;
    });
    if (G::lane() == 0) {
      rowResults[r] = make_float2(logf(s.sum) + mx - labelLogit, s.index == label ? kHit : kMissed);
    }
  }
}

// One block: sums[0] += Σ losses, sums[1] += hits, sums[2] += bad targets, over rowResults in the
// order the file's comment states.
__global__ void crossEntropySumKernel(const float2* __restrict__ rowResults, int64_t rows, float* __restrict__ sums) {
  double loss = 0.0, hits = 0.0, bad = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads) {
    const float2 v = rowResults[r];
    if (v.y == kBadTarget) {
      bad += 1.0;
    } else {
      loss += static_cast<double>(v.x);
      hits += v.y == kHit ? 1.0 : 0.0;
    }
  }
  loss = blockSum(loss);
  hits = blockSum(hits);
  bad = blockSum(bad);
  if (threadIdx.x == 0) {
    sums[0] += static_cast<float>(loss);
    sums[1] += static_cast<float>(hits);
    sums[2] += static_cast<float>(bad);
  }
}

template <class TX, class TG>
void launchCrossEntropy(const CrossEntropyBuffers& b, int64_t rows, int64_t cols, const Stream& stream) {
  const auto* x = static_cast<const TX*>(b.logits);
  auto* g = static_cast<TG*>(b.grad);
  const bool packed = cols % kPack == 0 && reinterpret_cast<uintptr_t>(x) % (kPack * sizeof(TX)) == 0 &&
                      reinterpret_cast<uintptr_t>(g) % (kPack * sizeof(TG)) == 0;
  const float invRows = 1.0f / static_cast<float>(rows);  // as nn/loss.cc
  auto* results = reinterpret_cast<float2*>(b.scratch);
  const unsigned blocks = rowBlocks(stream, rows, cols);
  const cudaStream_t s = nativeStream(stream);
  if (warpPerRow(cols)) {
    COHORT_LAUNCH((softmaxCrossEntropyKernel<kWarpSize, TX, TG>), blocks, kThreads, 0, s)(x, b.targets, g, rows, cols,
                                                                                         packed, invRows, results);
  } else {
    COHORT_LAUNCH((softmaxCrossEntropyKernel<kThreads, TX, TG>), blocks, kThreads, 0, s)(x, b.targets, g, rows, cols,
                                                                                        packed, invRows, results);
  }
  COHORT_CUDA_CHECK(cudaGetLastError());
  COHORT_LAUNCH(crossEntropySumKernel, 1, kThreads, 0, s)(results, rows, b.sums);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int64_t crossEntropyScratchFloats(int64_t rows) {
  COHORT_CHECK(rows >= 0) << rows;
  return 2 * rows;
}

void softmaxCrossEntropy(const CrossEntropyBuffers& b, int64_t rows, int64_t cols, const Stream& stream) {
  checkCudaStream(stream);
  COHORT_CHECK(rows >= 0 && cols >= 0) << "cross-entropy over " << rows << " x " << cols;
  if (rows == 0) return;
  COHORT_CHECK(cols > 0) << "cross-entropy over " << rows << " rows of 0 classes";
  COHORT_CHECK(b.grad != b.logits || b.gradType == b.logitsType)
      << "cross-entropy's gradient written over its logits must have their type";
  COHORT_CHECK(b.scratch != nullptr) << "cross-entropy without its scratch (crossEntropyScratchFloats)";
  CudaDeviceGuard guard(stream.device().index);
  elements::dispatch(b.logitsType, [&](auto logitsTag) {
    elements::dispatch(b.gradType, [&](auto gradTag) {
      launchCrossEntropy<typename decltype(logitsTag)::type, typename decltype(gradTag)::type>(b, rows, cols, stream);
    });
  });
}

}  // namespace cohort::runtime::cuda
