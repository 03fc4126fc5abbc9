// How the emulated cuDNN computes a convolution (cudnn_compute.h): im2col and oneDNN's sgemm.
#include "cudasim/cudnn_compute.h"

#include <omp.h>               // omp_set_num_threads: oneDNN's team size on this thread
#include <oneapi/dnnl/dnnl.h>  // dnnl_sgemm

#include <cstdio>
#include <cstdlib>

namespace cudasim::dnn {
namespace {

// The least m >= 0 with m · d >= n (d > 0).
int64_t ceilDivOrZero(int64_t n, int64_t d) { return n <= 0 ? 0 : (n + d - 1) / d; }

// Visits image n's columns col [T × P] (cudnn_compute.h), row-major, a run of one row at a time:
// inside(entries, x offset, count, x step) for `count` entries whose input positions lie in x, at
// the offset and `step` apart; padding(entries, count) for entries in the padding.
template <class Inside, class Padding>
void walkColumns(const Geometry& g, int64_t n, float* col, Inside&& inside, Padding&& padding) {
  const cudnnConvolutionStruct& cv = g.conv;
  const Dims::Strides xs = g.x.strides();
  const int64_t width = g.y.w, step = cv.strideW * xs.w;
  float* entry = col;
  for (int64_t c = 0; c < g.w.c; ++c) {
    for (int64_t r = 0; r < g.w.h; ++r) {
      for (int64_t s = 0; s < g.w.w; ++s) {
        // ow in [first, last) reads iw = ow · strideW + shift inside [0, W).
        const int64_t shift = s * cv.dilationW - cv.padW;
        const int64_t first = std::min(ceilDivOrZero(-shift, cv.strideW), width);
        const int64_t last = std::clamp(ceilDivOrZero(g.x.w - shift, cv.strideW), first, width);
        for (int64_t oh = 0; oh < g.y.h; ++oh, entry += width) {
          const int64_t ih = oh * cv.strideH - cv.padH + r * cv.dilationH;
          if (ih < 0 || ih >= g.x.h) {
            padding(entry, width);
            continue;
          }
          padding(entry, first);
          inside(entry + first, n * xs.n + c * xs.c + ih * xs.h + (first * cv.strideW + shift) * xs.w, last - first,
                 step);
          padding(entry + last, width - last);
        }
      }
    }
  }
}

// Calls f(i, w offset) for each entry i of the filter matrix wm [K × T] (cudnn_compute.h).
template <class F>
void forEachFilterEntry(const Geometry& g, F&& f) {
  const bool flip = g.conv.mode == CUDNN_CONVOLUTION;
  size_t i = 0;
  for (int64_t k = 0; k < g.w.n; ++k) {
    for (int64_t c = 0; c < g.w.c; ++c) {
      for (int64_t r = 0; r < g.w.h; ++r) {
        for (int64_t s = 0; s < g.w.w; ++s) {
          f(i++, flip ? g.w.at(k, c, g.w.h - 1 - r, g.w.w - 1 - s) : g.w.at(k, c, r, s));
        }
      }
    }
  }
}

// A row-major matrix as a product reads it: at p, stored transposed or not, with leading dimension ld.
struct Matrix {
  const float* p;
  bool transposed;
  int64_t ld;
};

// c [m × n] = a · b, a being m × k; with accumulate, c += a · b. (Positional: the calls read as the
// formulas of the file's comment.)
struct Product {
  int64_t m, n, k;
  Matrix a, b;
  float* c;
  int64_t ldc;
  bool accumulate;
};

// On the stream's thread alone, as cublas.cc runs SGEMM (why there). Without accumulate, c is not
// read (BLAS's beta == 0 rule, which oneDNN keeps), so what a scratch buffer held does not survive.
void multiply(const Product& p) {
  omp_set_num_threads(1);  // this thread's setting, which oneDNN sizes its team by
  const dnnl_status_t status = dnnl_sgemm(p.a.transposed ? 'T' : 'N', p.b.transposed ? 'T' : 'N', p.m, p.n, p.k, 1.0f,
                                          p.a.p, p.a.ld, p.b.p, p.b.ld, p.accumulate ? 1.0f : 0.0f, p.c, p.ldc);
  if (status != dnnl_success) {  // the arguments were checked at the call: a bug here, not the caller's
    std::fprintf(stderr, "cudasim: dnnl_sgemm(%lld x %lld x %lld) failed with status %d\n", static_cast<long long>(p.m),
                 static_cast<long long>(p.n), static_cast<long long>(p.k), static_cast<int>(status));
    std::abort();
  }
}

// Image n of y (or dy) as the K × P matrix of cudnn_compute.h: row-major in NCHW; in NHWC stored
// as its P × K transpose.
Matrix yImage(const Geometry& g, const float* y, int64_t n) {
  const int64_t filters = g.y.c, positions = g.positions();
  const bool nhwc = g.y.format == CUDNN_TENSOR_NHWC;
  return {y + n * filters * positions, nhwc, nhwc ? filters : positions};
}

// The filter matrix wm [K × T] (cudnn_compute.h), its entries as the products read them.
std::vector<float> filterMatrix(const Geometry& g, const float* w) {
  std::vector<float> wm(g.w.count());
  forEachFilterEntry(g, [&](size_t i, int64_t at) { wm[i] = g.operand(w[at]); });
  return wm;
}

// dy as the products read it: itself, or a rounded copy held in `rounded`.
const float* dyOperand(const Geometry& g, const float* dy, std::vector<float>* rounded) {
  if (g.exactOperands()) return dy;
  rounded->resize(g.y.count());
  std::transform(dy, dy + g.y.count(), rounded->begin(), [&](float v) { return g.operand(v); });
  return rounded->data();
}

void im2col(const Geometry& g, const float* x, int64_t n, float* col) {
  auto inside = [&](float* entries, int64_t at, int64_t count, int64_t step) {
    if (g.exactOperands() && step == 1) {
      std::copy_n(x + at, count, entries);
    } else {
      for (int64_t i = 0; i < count; ++i) entries[i] = g.operand(x[at + i * step]);
    }
  };
  walkColumns(g, n, col, inside, [](float* entries, int64_t count) { std::fill_n(entries, count, 0.0f); });
}

}  // namespace

void blendInto(float& out, double value, float alpha, float beta) {
  const double scaled = static_cast<double>(alpha) * value;
  out = static_cast<float>(beta == 0.0f ? scaled : scaled + static_cast<double>(beta) * out);
}

// y = alpha · (y_n = wm · col_n for each image n) + beta · y.
void forward(const Geometry& g, const Tensors& t) {
  const int64_t taps = g.taps(), positions = g.positions(), filters = g.w.n;
  const std::vector<float> wm = filterMatrix(g, t.w);
  std::vector<float> col(static_cast<size_t>(taps * positions)), sum(g.y.count());
  for (int64_t n = 0; n < g.x.n; ++n) {
    im2col(g, t.x, n, col.data());
    float* y = sum.data() + n * filters * positions;
    if (g.y.format == CUDNN_TENSOR_NHWC) {  // y_nᵀ = col_nᵀ · wmᵀ
      multiply({positions, filters, taps, {col.data(), true, positions}, {wm.data(), true, taps}, y, filters, false});
    } else {
      multiply(
          {filters, positions, taps, {wm.data(), false, taps}, {col.data(), false, positions}, y, positions, false});
    }
  }
  blend(t.out, sum, t.alpha, t.beta);
}

// dx = alpha · (wmᵀ · dy_n for each image n, its columns added back into x's positions) + beta · dx.
void backwardData(const Geometry& g, const Tensors& t) {
  const int64_t taps = g.taps(), positions = g.positions(), filters = g.w.n;
  const std::vector<float> wm = filterMatrix(g, t.w);
  std::vector<float> rounded;
  const float* dy = dyOperand(g, t.y, &rounded);
  std::vector<float> col(static_cast<size_t>(taps * positions)), sum(g.x.count());
  for (int64_t n = 0; n < g.x.n; ++n) {
    multiply({taps, positions, filters, {wm.data(), true, taps}, yImage(g, dy, n), col.data(), positions, false});
    auto addBack = [&](const float* entries, int64_t at, int64_t count, int64_t step) {
      for (int64_t i = 0; i < count; ++i) sum[static_cast<size_t>(at + i * step)] += entries[i];
    };
    walkColumns(g, n, col.data(), addBack, [](float*, int64_t) {});
  }
  blend(t.out, sum, t.alpha, t.beta);
}

// dw = alpha · (Σ over images n of dy_n · col_nᵀ, back in w's layout) + beta · dw.
void backwardFilter(const Geometry& g, const Tensors& t) {
  const int64_t taps = g.taps(), positions = g.positions(), filters = g.w.n;
  std::vector<float> rounded;
  const float* dy = dyOperand(g, t.y, &rounded);
  std::vector<float> col(static_cast<size_t>(taps * positions)), dwm(g.w.count());
  for (int64_t n = 0; n < g.x.n; ++n) {
    im2col(g, t.x, n, col.data());
    multiply({filters, taps, positions, yImage(g, dy, n), {col.data(), true, positions}, dwm.data(), taps, n > 0});
  }
  forEachFilterEntry(g, [&](size_t i, int64_t at) { blendInto(t.out[at], dwm[i], t.alpha, t.beta); });
}

}  // namespace cudasim::dnn
