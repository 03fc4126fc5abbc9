// cudasim's mma.h: the warp matrix functions (nvcuda::wmma) for the shape and types Cohort's
// kernels use, m16n16k16 with bf16 A and B and a float accumulator, with the real header's names
// and signatures (only the cudasim configuration puts this directory on the include path).
//
// As on a GPU, a fragment's elements are spread over the warp's 32 lanes in an unspecified order:
// here, element e of lane l is element e·32 + l of the matrix in row-major order (rows x cols of
// A: 16x16, B: 16x16, C: 16x16), so code that assumes some other mapping (reading a fragment's x[]
// as rows, say) computes garbage and fails its tests. Elementwise work on x[] (scaling, fill) is
// valid under any mapping, as it is on hardware. Every function is warp-collective: all 32 lanes
// must call it with the same arguments. mma_sync exchanges the fragments through three warp barriers
// (cudasim::gatherInWarp, then syncWarp before D is written) and sums each output element's 16 products in fp32, in k order, on top
// of C's element (bf16 products are exact in fp32); D may be C. The memory rules are the real
// ones, checked, with a message and abort on a violation: the pointer of a load or store 32-byte
// aligned (256 bits), ldm a multiple of 8 elements for bf16 and 4 for float.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cuda_bf16.h"
#include "cudasim/device.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {

template <class Use, int M, int N, int K>
struct Dims;
template <int M, int N, int K>
struct Dims<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct Dims<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct Dims<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

inline void checkMemory(const void* p, unsigned ldm, unsigned elementsPerLine, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0 || ldm % elementsPerLine != 0) {
    std::fprintf(stderr,
                 "cudasim: %s with pointer %p and ldm %u: wmma needs a 32-byte aligned pointer and ldm a multiple of "
                 "%u elements\n",
                 what, p, ldm, elementsPerLine);
    std::abort();
  }
}

inline float widen(float x) { return x; }
inline float widen(__nv_bfloat16 x) { return __bfloat162float(x); }

}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "cudasim emulates wmma's m16n16k16 only");
  static constexpr int rows = detail::Dims<Use, M, N, K>::rows, cols = detail::Dims<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols / 32;
  using element_type = T;
  T x[num_elements];
};

template <class Use, int M, int N, int K, class T, class Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, T value) {
  for (T& v : f.x) v = value;
}

// A or B from memory in `Layout` (row_major: element (r, c) at p[r·ldm + c]; col_major: p[c·ldm + r]).
template <class Use, int M, int N, int K, class Layout>
void load_matrix_sync(fragment<Use, M, N, K, __nv_bfloat16, Layout>& f, const __nv_bfloat16* p, unsigned ldm) {
  using F = fragment<Use, M, N, K, __nv_bfloat16, Layout>;
  detail::checkMemory(p, ldm, 8, "wmma::load_matrix_sync");
  const int lane = ::cudasim::laneId();
  for (int e = 0; e < F::num_elements; ++e) {
    const int at = e * 32 + lane, r = at / F::cols, c = at % F::cols;
    f.x[e] = std::is_same_v<Layout, row_major> ? p[r * ldm + c] : p[c * ldm + r];
  }
}

template <int M, int N, int K>
void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t layout) {
  using F = fragment<accumulator, M, N, K, float>;
  detail::checkMemory(p, ldm, 4, "wmma::load_matrix_sync");
  const int lane = ::cudasim::laneId();
  for (int e = 0; e < F::num_elements; ++e) {
    const int at = e * 32 + lane, r = at / F::cols, c = at % F::cols;
    f.x[e] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
  }
}

template <int M, int N, int K>
void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
  using F = fragment<accumulator, M, N, K, float>;
  detail::checkMemory(p, ldm, 4, "wmma::store_matrix_sync");
  const int lane = ::cudasim::laneId();
  for (int e = 0; e < F::num_elements; ++e) {
    const int at = e * 32 + lane, r = at / F::cols, c = at % F::cols;
    (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[e];
  }
}

// D = A · B + C over the warp.
template <int M, int N, int K, class LayoutA, class LayoutB>
void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, __nv_bfloat16, LayoutA>& a,
              const fragment<matrix_b, M, N, K, __nv_bfloat16, LayoutB>& b,
              const fragment<accumulator, M, N, K, float>& c) {
  using A = fragment<matrix_a, M, N, K, __nv_bfloat16, LayoutA>;
  using B = fragment<matrix_b, M, N, K, __nv_bfloat16, LayoutB>;
  using C = fragment<accumulator, M, N, K, float>;
  struct Operands {
    const A* a;
    const B* b;
    const C* c;
  } mine{&a, &b, &c};
  uint64_t all[32];
  ::cudasim::gatherInWarp(0xffffffffu, reinterpret_cast<uint64_t>(&mine), all);
  auto lanes = [&](int l) { return reinterpret_cast<const Operands*>(all[l]); };
  const int lane = ::cudasim::laneId();
  float out[C::num_elements];
  for (int e = 0; e < C::num_elements; ++e) {
    const int at = e * 32 + lane, i = at / N, j = at % N;
    float sum = lanes(at % 32)->c->x[at / 32];
    for (int k = 0; k < K; ++k) {
      const int ai = i * K + k, bi = k * N + j;
      sum += detail::widen(lanes(ai % 32)->a->x[ai / 32]) * detail::widen(lanes(bi % 32)->b->x[bi / 32]);
    }
    out[e] = sum;
  }
  // Every lane has read every operand before any writes D (which may be another lane's C).
  ::cudasim::syncWarp(0xffffffffu);
  for (int e = 0; e < C::num_elements; ++e) d.x[e] = out[e];
}

}  // namespace nvcuda::wmma
