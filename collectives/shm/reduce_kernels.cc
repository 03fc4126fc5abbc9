#include "collectives/shm/reduce_kernels.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "runtime/dtype.h"
#include "runtime/error.h"

namespace cohort::collectives::shm {

namespace {

// Binary operations as functors so each loop below is one tight, vectorisable body.
struct Sum {
  float operator()(float a, float b) const { return a + b; }
};
struct Max {
  float operator()(float a, float b) const { return a > b ? a : b; }
};
struct Min {
  float operator()(float a, float b) const { return a < b ? a : b; }
};

// out = a op b (op folded pairwise, out may alias a).
template <class Op>
void combine2(float* out, const float* a, const float* __restrict__ b, size_t n, Op op) {
  for (size_t i = 0; i < n; ++i) out[i] = op(a[i], b[i]);
}

template <class Op>
void combine3(float* out, const float* a, const float* __restrict__ b, const float* __restrict__ c, size_t n, Op op) {
  for (size_t i = 0; i < n; ++i) out[i] = op(op(a[i], b[i]), c[i]);
}

template <class Op>
void combine4(float* out, const float* a, const float* __restrict__ b, const float* __restrict__ c,
              const float* __restrict__ d, size_t n, Op op) {
  for (size_t i = 0; i < n; ++i) out[i] = op(op(op(a[i], b[i]), c[i]), d[i]);
}

// Folds all sources into out in passes of up to four inputs, in blocks that stay in L1/L2, so each
// source is read once from memory and `out` is written once.
template <class Op>
void reduceBlocked(float* out, const float* const* src, int k, size_t n, Op op) {
  constexpr size_t kBlock = 4096;  // floats: 16 KiB per stream
  for (size_t at = 0; at < n; at += kBlock) {
    size_t len = std::min(kBlock, n - at);
    int used = std::min(k, 4);
    if (used == 1) std::memmove(out + at, src[0] + at, len * sizeof(float));
    if (used == 2) combine2(out + at, src[0] + at, src[1] + at, len, op);
    if (used == 3) combine3(out + at, src[0] + at, src[1] + at, src[2] + at, len, op);
    if (used == 4) combine4(out + at, src[0] + at, src[1] + at, src[2] + at, src[3] + at, len, op);
    for (int s = used; s < k; s += 3) {
      int more = std::min(k - s, 3);
      if (more == 1) combine2(out + at, out + at, src[s] + at, len, op);
      if (more == 2) combine3(out + at, out + at, src[s] + at, src[s + 1] + at, len, op);
      if (more == 3) combine4(out + at, out + at, src[s] + at, src[s + 1] + at, src[s + 2] + at, len, op);
    }
  }
}

void scaleInPlace(float* __restrict__ out, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) out[i] *= scale;
}

// Whether `out` is one of the sources after the first: the loops above would overwrite it before
// reading it (and their __restrict__ forbids it).
bool aliasesLaterSource(const float* out, const float* const* sources, int numSources) {
  for (int s = 1; s < numSources; ++s) {
    if (sources[s] == out) return true;
  }
  return false;
}

void reduceUnaliased(float* out, const float* const* sources, int numSources, size_t count, ReduceOp op, float scale) {
  switch (op) {
    case ReduceOp::kSum:
      reduceBlocked(out, sources, numSources, count, Sum{});
      break;
    case ReduceOp::kAvg: {
      constexpr size_t kBlock = 4096;
      for (size_t at = 0; at < count; at += kBlock) {
        size_t len = std::min(kBlock, count - at);
        const float* shifted[kMaxSources];
        for (int s = 0; s < numSources; ++s) shifted[s] = sources[s] + at;
        reduceBlocked(out + at, shifted, numSources, len, Sum{});
        scaleInPlace(out + at, len, scale);
      }
      break;
    }
    case ReduceOp::kMax:
      reduceBlocked(out, sources, numSources, count, Max{});
      break;
    case ReduceOp::kMin:
      reduceBlocked(out, sources, numSources, count, Min{});
      break;
  }
}

// Block by block into a buffer on the stack, then out: every source's block is read before `out`'s
// is written.
void reduceThroughBlock(float* out, const float* const* sources, int numSources, size_t count, ReduceOp op,
                        float scale) {
  constexpr size_t kBlock = 4096;
  alignas(64) float block[kBlock];
  const float* shifted[kMaxSources];
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t len = std::min(kBlock, count - at);
    for (int s = 0; s < numSources; ++s) shifted[s] = sources[s] + at;
    reduceUnaliased(block, shifted, numSources, len, op, scale);
    std::memcpy(out + at, block, len * sizeof(float));
  }
}

}  // namespace

void reduceInto(float* out, const float* const* sources, int numSources, size_t count, ReduceOp op, float scale) {
  COHORT_CHECK(numSources >= 1 && numSources <= kMaxSources) << numSources << " sources";
  if (count == 0) return;
  if (aliasesLaterSource(out, sources, numSources)) {
    reduceThroughBlock(out, sources, numSources, count, op, scale);
    return;
  }
  reduceUnaliased(out, sources, numSources, count, op, scale);
}

void reduceIntoBf16(uint16_t* out, const uint16_t* const* sources, int numSources, size_t count, ReduceOp op,
                    float scale) {
  COHORT_CHECK(numSources >= 1 && numSources <= kMaxSources) << numSources << " sources";
  // Blocks of kBlock widened to fp32 on the stack: every source is read before `out` is written, so
  // out == sources[0] is safe, and the sum is rounded once.
  constexpr size_t kBlock = 1024;
  float acc[kBlock];
  float widened[kBlock];
  for (size_t at = 0; at < count; at += kBlock) {
    const size_t len = std::min(kBlock, count - at);
    for (size_t i = 0; i < len; ++i) acc[i] = runtime::toFloat(runtime::Bf16{sources[0][at + i]});
    for (int s = 1; s < numSources; ++s) {
      for (size_t i = 0; i < len; ++i) widened[i] = runtime::toFloat(runtime::Bf16{sources[s][at + i]});
      const float* const one[2] = {acc, widened};
      reduceInto(acc, one, 2, len, op == ReduceOp::kAvg ? ReduceOp::kSum : op, 1.0f);
    }
    if (op == ReduceOp::kAvg) scaleInPlace(acc, len, scale);
    for (size_t i = 0; i < len; ++i) out[at + i] = runtime::toBf16(acc[i]).bits;
  }
}

void reduceInto(runtime::DType dtype, void* out, const void* const* sources, int numSources, size_t count, ReduceOp op,
                float scale) {
  if (dtype == runtime::DType::kBF16) {
    reduceIntoBf16(static_cast<uint16_t*>(out), reinterpret_cast<const uint16_t* const*>(sources), numSources, count,
                   op, scale);
  } else {
    reduceInto(static_cast<float*>(out), reinterpret_cast<const float* const*>(sources), numSources, count, op, scale);
  }
}

void copyStreamingBytes(void* out, const void* in, size_t bytes) {
  if (bytes % sizeof(float) != 0) {
    std::memcpy(out, in, bytes);
    return;
  }
  copyStreaming(static_cast<float*>(out), static_cast<const float*>(in), bytes / sizeof(float));
}

void copyStreaming(float* out, const float* in, size_t count) {
  size_t head = (32 - reinterpret_cast<uintptr_t>(out) % 32) % 32 / sizeof(float);
  if (reinterpret_cast<uintptr_t>(out) % sizeof(float) != 0 || count < head + 64) {
    std::memcpy(out, in, count * sizeof(float));
    return;
  }
  std::memcpy(out, in, head * sizeof(float));
  size_t i = head;
  for (; i + 32 <= count; i += 32) {
    __m256 a = _mm256_loadu_ps(in + i);
    __m256 b = _mm256_loadu_ps(in + i + 8);
    __m256 c = _mm256_loadu_ps(in + i + 16);
    __m256 d = _mm256_loadu_ps(in + i + 24);
    _mm256_stream_ps(out + i, a);
    _mm256_stream_ps(out + i + 8, b);
    _mm256_stream_ps(out + i + 16, c);
    _mm256_stream_ps(out + i + 24, d);
  }
  std::memcpy(out + i, in + i, (count - i) * sizeof(float));
  _mm_sfence();
}

}  // namespace cohort::collectives::shm
