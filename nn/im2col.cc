#include "nn/im2col.h"

#include <algorithm>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace cohort::nn {
namespace {

#ifdef __AVX2__
// The first n (0..8) lanes.
__m256i firstLanes(int64_t n) {
  alignas(32) static constexpr int32_t kLanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kLanes + 8 - n));
}
#endif

// dst[0, n) = src[0, n). Feature-map rows are short (tens of floats), where a call to memcpy or a
// scalar remainder loop costs as much as the copy: whole 8-float vectors, the last one overlapping
// the one before (rows of 8 or more) or masked (shorter rows; masked stores are slow).
void copyRow(float* dst, const float* src, int64_t n) {
  int64_t j = 0;
#ifdef __AVX2__
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(dst + j, _mm256_loadu_ps(src + j));
  if (j < n) {
    if (n >= 8) {
      _mm256_storeu_ps(dst + n - 8, _mm256_loadu_ps(src + n - 8));
    } else {
      const __m256i m = firstLanes(n);
      _mm256_maskstore_ps(dst, m, _mm256_maskload_ps(src, m));
    }
    return;
  }
#endif
  for (; j < n; ++j) dst[j] = src[j];
}

// Any stride: one pass per column-matrix row, scattering into dx.
void col2imStrided(const Unfolding& u, const float* col, int64_t ld, int64_t rowBegin, int64_t rowEnd, float* dx) {
  const int64_t ow = u.outWidth;
  int64_t row = 0;
  for (int64_t c = 0; c < u.channels; ++c) {
    float* plane = dx + c * u.height * u.width;
    for (int64_t ki = 0; ki < u.kh; ++ki) {
      auto [iBegin, iEnd] = u.valid(ki, u.height, u.outHeight);
      iBegin = std::clamp(iBegin, rowBegin, rowEnd);
      iEnd = std::clamp(iEnd, iBegin, rowEnd);
      for (int64_t kj = 0; kj < u.kw; ++kj, ++row) {
        auto [jBegin, jEnd] = u.valid(kj, u.width, ow);
        for (int64_t i = iBegin; i < iEnd; ++i) {
          const float* src = col + row * ld + (i - rowBegin) * ow;
          float* dst = plane + (i * u.stride - u.padding + ki) * u.width;
          for (int64_t j = jBegin; j < jEnd; ++j) dst[j * u.stride - u.padding + kj] += src[j];
        }
      }
    }
  }
}

// Stride 1, gathering instead of scattering: each input element sums its taps, the elements
// col[(c, ki, kj), (ih + p − ki − rowBegin)·OW + iw + p − kj], in a register and is read and written
// once per tile instead of once per tap (a tap's row is ld − 1 floats after the previous one's).
// Columns iw in [lo, hi) have all kw taps inside the output row; the few outside take a scalar path.
void col2imStride1(const Unfolding& u, const float* col, int64_t ld, int64_t rowBegin, int64_t rowEnd, float* dx) {
  const int64_t ow = u.outWidth, w = u.width, p = u.padding, kh = u.kh, kw = u.kw;
  const int64_t lo = std::max<int64_t>(0, kw - 1 - p), hi = std::min(w, ow - p);
  const int64_t ihBegin = std::max<int64_t>(0, rowBegin - p), ihEnd = std::min(u.height, rowEnd - p + kh - 1);
  for (int64_t c = 0; c < u.channels; ++c) {
    const float* taps = col + c * kh * kw * ld;
    for (int64_t ih = ihBegin; ih < ihEnd; ++ih) {
      float* out = dx + (c * u.height + ih) * w;
      // Kernel rows whose output row ih + p − ki lies in the tile.
      const int64_t kiBegin = std::max<int64_t>(0, ih + p - rowEnd + 1), kiEnd = std::min(kh, ih + p - rowBegin + 1);
      // The first tap (kj = 0) of column iw for kernel row ki.
      auto firstTap = [&](int64_t ki, int64_t iw) {
        return taps + ki * kw * ld + (ih + p - ki - rowBegin) * ow + iw + p;
      };
      auto scalar = [&](int64_t iw) {
        const int64_t kjBegin = std::max<int64_t>(0, iw + p - ow + 1), kjEnd = std::min(kw, iw + p + 1);
        float sum = 0.0f;
        for (int64_t ki = kiBegin; ki < kiEnd; ++ki) {
          for (int64_t kj = kjBegin; kj < kjEnd; ++kj)
            sum += taps[ki * kw * ld + (ih + p - ki - rowBegin) * ow + kj * ld + iw + p - kj];
        }
        out[iw] += sum;
      };
      for (int64_t iw = 0; iw < std::min(lo, w); ++iw) scalar(iw);
      for (int64_t iw = std::max(lo, hi); iw < w; ++iw) scalar(iw);
      int64_t iw = lo;
#ifdef __AVX2__
      auto gather = [&](int64_t first, auto load) {
        __m256 sum = _mm256_setzero_ps();
        for (int64_t ki = kiBegin; ki < kiEnd; ++ki) {
          const float* tap = firstTap(ki, first);
          for (int64_t kj = 0; kj < kw; ++kj, tap += ld - 1) sum = _mm256_add_ps(sum, load(tap));
        }
        return sum;
      };
      for (; iw + 8 <= hi; iw += 8) {
        const __m256 sum = gather(iw, [](const float* at) { return _mm256_loadu_ps(at); });
        _mm256_storeu_ps(out + iw, _mm256_add_ps(_mm256_loadu_ps(out + iw), sum));
      }
      if (iw < hi) {
        const __m256i m = firstLanes(hi - iw);
        const __m256 sum = gather(iw, [m](const float* at) { return _mm256_maskload_ps(at, m); });
        _mm256_maskstore_ps(out + iw, m, _mm256_add_ps(_mm256_maskload_ps(out + iw, m), sum));
        iw = hi;
      }
#endif
      for (; iw < hi; ++iw) scalar(iw);
    }
  }
}

}  // namespace

std::pair<int64_t, int64_t> Unfolding::valid(int64_t offset, int64_t size, int64_t outSize) const {
  const int64_t lo = padding - offset;  // need k·stride >= lo
  const int64_t begin = lo <= 0 ? 0 : (lo + stride - 1) / stride;
  const int64_t hi = size - 1 + padding - offset;  // need k·stride <= hi
  const int64_t end = hi < 0 ? 0 : std::min(outSize, hi / stride + 1);
  return {std::min(begin, end), end};
}

void im2col(const Unfolding& u, const float* x, int64_t rowBegin, int64_t rowEnd, float* col, int64_t ld) {
  const int64_t ow = u.outWidth;
  int64_t row = 0;
  for (int64_t c = 0; c < u.channels; ++c) {
    const float* plane = x + c * u.height * u.width;
    for (int64_t ki = 0; ki < u.kh; ++ki) {
      auto [iBegin, iEnd] = u.valid(ki, u.height, u.outHeight);
      iBegin = std::clamp(iBegin, rowBegin, rowEnd);
      iEnd = std::clamp(iEnd, iBegin, rowEnd);
      for (int64_t kj = 0; kj < u.kw; ++kj, ++row) {
        auto [jBegin, jEnd] = u.valid(kj, u.width, ow);
        float* dst = col + row * ld;
        std::fill(dst, dst + (iBegin - rowBegin) * ow, 0.0f);  // output rows that read only padding
        std::fill(dst + (iEnd - rowBegin) * ow, dst + (rowEnd - rowBegin) * ow, 0.0f);
        for (int64_t i = iBegin; i < iEnd; ++i) {
          float* out = dst + (i - rowBegin) * ow;
          std::fill(out, out + jBegin, 0.0f);
          std::fill(out + jEnd, out + ow, 0.0f);
          if (jBegin == jEnd) continue;
          // Output column j reads input column j·stride − padding + kj, inside the row for j in [jBegin, jEnd).
          const float* src = plane + (i * u.stride - u.padding + ki) * u.width + jBegin * u.stride - u.padding + kj;
          if (u.stride == 1) {
            copyRow(out + jBegin, src, jEnd - jBegin);
          } else {
            for (int64_t j = jBegin; j < jEnd; ++j) out[j] = src[(j - jBegin) * u.stride];
          }
        }
      }
    }
  }
}

void col2im(const Unfolding& u, const float* col, int64_t ld, int64_t rowBegin, int64_t rowEnd, float* dx) {
  if (u.stride == 1) {
    col2imStride1(u, col, ld, rowBegin, rowEnd, dx);
  } else {
    col2imStrided(u, col, ld, rowBegin, rowEnd, dx);
  }
}

}  // namespace cohort::nn
