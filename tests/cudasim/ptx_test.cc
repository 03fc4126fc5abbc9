// The warp-level PTX layer (runtime/cuda/warp_mma.h) as the emulated device runs it
// (cudasim/include/cudasim/ptx.h): mma m16n8k16 on random bf16 equals a scalar product with the
// PTX ISA's fragment layouts, also with its operands taken by ldmatrix from shared tiles; ldmatrix
// .x4, .x2 and .trans give each lane the elements the ISA documents; cp.async copies land at the
// wait that covers their group and not before (a kernel that forgets the wait reads stale bytes),
// with zeros where the copy is not valid; and the mistakes the hardware refuses (a misaligned or
// global address, a warp with a lane gone) stop the program with a message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_runtime.h"
#include "runtime/cuda/warp_mma.h"

namespace {

namespace ptx = cohort::runtime::cuda::ptx;

#define LAUNCH(kernel, grid, block) ::cudasim::Launch(kernel, #kernel, grid, block, 0, nullptr)

template <class T>
T* toDevice(const std::vector<T>& v) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(v.size(), 1) * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}

template <class T>
std::vector<T> toHost(const T* p, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

float bf16Float(uint16_t bits) { return __bfloat162float(__nv_bfloat16{bits}); }

// D = A·B + C, each lane building its fragments from global memory by the documented layout:
// a (16x16 row-major bf16 bits), b (16x8, element (k, n) at b[k·8 + n]), c and d (16x8 fp32).
__global__ void mmaFromLayoutKernel(const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  const int lane = threadIdx.x, group = lane / 4, tid = lane % 4;
  auto pair = [](uint16_t low, uint16_t high) { return static_cast<uint32_t>(low) | static_cast<uint32_t>(high) << 16; };
  auto aPair = [&](int row, int col) { return pair(a[row * 16 + col], a[row * 16 + col + 1]); };
  auto bPair = [&](int k, int n) { return pair(b[k * 8 + n], b[(k + 1) * 8 + n]); };
  const uint32_t fa[4] = {aPair(group, 2 * tid), aPair(group + 8, 2 * tid), aPair(group, 2 * tid + 8),
                          aPair(group + 8, 2 * tid + 8)};
  const uint32_t fb[2] = {bPair(2 * tid, group), bPair(2 * tid + 8, group)};
  float acc[4] = {c[group * 8 + 2 * tid], c[group * 8 + 2 * tid + 1], c[(group + 8) * 8 + 2 * tid],
                  c[(group + 8) * 8 + 2 * tid + 1]};
  ptx::mma16816(acc, fa, fb, acc);  // D in C's registers, as kernels accumulate
  d[group * 8 + 2 * tid] = acc[0], d[group * 8 + 2 * tid + 1] = acc[1];
  d[(group + 8) * 8 + 2 * tid] = acc[2], d[(group + 8) * 8 + 2 * tid + 1] = acc[3];
}

// The same product with A taken by ldmatrixX4 from a shared 16x16 tile and B by ldmatrixX2 from a
// shared tile stored [n][k] (Bᵀ row-major, as a K tile is), or by ldmatrixX2Trans from one stored
// [k][n] (as a V tile is): `bTransposed` picks which. C is zero.
__global__ void mmaFromSharedKernel(const uint16_t* a, const uint16_t* b, float* d, bool bTransposed) {
  alignas(16) __shared__ uint16_t aTile[16][16];
  alignas(16) __shared__ uint16_t bTile[16][8];   // [k][n]
  alignas(16) __shared__ uint16_t btTile[8][16];  // [n][k]
  const int lane = threadIdx.x;
  for (int i = lane; i < 256; i += 32) aTile[i / 16][i % 16] = a[i];
  for (int i = lane; i < 128; i += 32) bTile[i / 8][i % 8] = b[i], btTile[i % 8][i / 8] = b[i];
  __syncwarp();
  uint32_t fa[4], fb[2];
  ptx::ldmatrixX4(fa, &aTile[lane % 16][8 * (lane / 16)]);
  if (bTransposed) {
    ptx::ldmatrixX2Trans(fb, &bTile[lane % 16][0]);
  } else {
    ptx::ldmatrixX2(fb, &btTile[lane % 8][8 * (lane / 8 % 2)]);
  }
  float acc[4] = {0, 0, 0, 0};
  ptx::mma16816(acc, fa, fb, acc);
  const int group = lane / 4, tid = lane % 4;
  d[group * 8 + 2 * tid] = acc[0], d[group * 8 + 2 * tid + 1] = acc[1];
  d[(group + 8) * 8 + 2 * tid] = acc[2], d[(group + 8) * 8 + 2 * tid + 1] = acc[3];
}

struct MmaCase {
  std::vector<uint16_t> a, b;  // bf16 bits
  std::vector<float> c;
};

MmaCase randomCase(unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  MmaCase m{std::vector<uint16_t>(256), std::vector<uint16_t>(128), std::vector<float>(128)};
  for (auto& x : m.a) x = __float2bfloat16_rn(u(rng)).__x;
  for (auto& x : m.b) x = __float2bfloat16_rn(u(rng)).__x;
  for (auto& x : m.c) x = u(rng);
  return m;
}

// d against Σ_k A(i, k)·B(k, j) + C(i, j) in double, within fp32's rounding of 17 terms.
void expectProduct(const MmaCase& m, const std::vector<float>& d, bool withC) {
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) {
      double want = withC ? m.c[i * 8 + j] : 0.0, magnitude = std::abs(want);
      for (int k = 0; k < 16; ++k) {
        const double p = static_cast<double>(bf16Float(m.a[i * 16 + k])) * bf16Float(m.b[k * 8 + j]);
        want += p, magnitude += std::abs(p);
      }
      ASSERT_NEAR(d[i * 8 + j], want, 17 * 6e-8 * magnitude + 1e-30) << "(" << i << ", " << j << ")";
    }
  }
}

TEST(CudasimPtx, Mma16816MatchesTheScalarProductOnRandomBf16) {
  for (unsigned seed : {1u, 2u, 3u}) {
    const MmaCase m = randomCase(seed);
    uint16_t *a = toDevice(m.a), *b = toDevice(m.b);
    float* c = toDevice(m.c);
    float* d = toDevice(std::vector<float>(128, NAN));
    LAUNCH(mmaFromLayoutKernel, 1, 32)(a, b, c, d);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expectProduct(m, toHost(d, 128), true);
    for (bool bTransposed : {false, true}) {
      LAUNCH(mmaFromSharedKernel, 1, 32)(a, b, d, bTransposed);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      expectProduct(m, toHost(d, 128), false);
    }
    cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(d);
  }
}

// Four 8x8 matrices in shared memory, element (m, r, c) holding m·64 + r·8 + c; lane l gives row
// l % 8 of matrix l / 8 (lanes 16.. give no address to the .x2 forms: theirs are ignored). Each
// lane writes its registers to out[lane·4 + i].
__global__ void ldmatrixKernel(uint32_t* out, int count, bool trans) {
  alignas(16) __shared__ uint16_t mats[4][8][8];
  const int lane = threadIdx.x;
  for (int i = lane; i < 256; i += 32) mats[i / 64][i / 8 % 8][i % 8] = static_cast<uint16_t>(i);
  __syncwarp();
  const void* row = lane < 8 * count ? &mats[lane / 8][lane % 8][0] : nullptr;
  uint32_t r[4] = {0, 0, 0, 0};
  if (count == 4) {
    uint32_t (&r4)[4] = r;
    trans ? ptx::ldmatrixX4Trans(r4, row) : ptx::ldmatrixX4(r4, row);
  } else {
    uint32_t(&r2)[2] = reinterpret_cast<uint32_t(&)[2]>(r);
    trans ? ptx::ldmatrixX2Trans(r2, row) : ptx::ldmatrixX2(r2, row);
  }
  for (int i = 0; i < 4; ++i) out[lane * 4 + i] = r[i];
}

TEST(CudasimPtx, LdmatrixGivesEachLaneTheDocumentedPairs) {
  uint32_t* out = toDevice(std::vector<uint32_t>(128));
  for (int count : {2, 4}) {
    for (bool trans : {false, true}) {
      LAUNCH(ldmatrixKernel, 1, 32)(out, count, trans);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<uint32_t> got = toHost(out, 128);
      for (int lane = 0; lane < 32; ++lane) {
        for (int m = 0; m < 4; ++m) {
          // Row lane/4, columns 2(lane%4)..+1 of matrix m, or of its transpose.
          const int r = lane / 4, c = 2 * (lane % 4);
          auto element = [&](int row, int col) { return static_cast<uint32_t>(m * 64 + row * 8 + col); };
          const uint32_t want = m >= count ? 0
                                : trans    ? element(c, r) | element(c + 1, r) << 16
                                           : element(r, c) | element(r, c + 1) << 16;
          ASSERT_EQ(got[lane * 4 + m], want) << "x" << count << (trans ? ".trans" : "") << " lane " << lane
                                             << " matrix " << m;
        }
      }
    }
  }
  cudaFree(out);
}

constexpr uint32_t kStale = 0xdeadbeefu;
enum class Wait { kAll, kAllButNewest, kNone };

// 32 threads each copy 16 bytes into two groups (the second's copy not valid on odd threads), wait
// as `wait` says, meet at __syncthreads, and each writes what its neighbour's copies left in shared
// memory (which held kStale before) to out: group 0's 4 words, then group 1's.
__global__ void cpAsyncKernel(const uint32_t* src, uint32_t* out, Wait wait) {
  alignas(16) __shared__ uint32_t tile[2][32 * 4];
  const int t = threadIdx.x;
  for (int i = 0; i < 4; ++i) tile[0][t * 4 + i] = tile[1][t * 4 + i] = kStale;
  __syncthreads();
  ptx::cpAsync16(&tile[0][t * 4], src + t * 4, true);
  ptx::cpAsyncCommit();
  ptx::cpAsync16(&tile[1][t * 4], src + 128 + t * 4, t % 2 == 0);
  ptx::cpAsyncCommit();
  if (wait == Wait::kAll) ptx::cpAsyncWait<0>();
  if (wait == Wait::kAllButNewest) ptx::cpAsyncWait<1>();
  __syncthreads();
  const int n = (t + 1) % 32;
  for (int i = 0; i < 4; ++i) out[t * 8 + i] = tile[0][n * 4 + i], out[t * 8 + 4 + i] = tile[1][n * 4 + i];
}

TEST(CudasimPtx, CpAsyncLandsAtTheWaitThatCoversItsGroupAndNotBefore) {
  std::vector<uint32_t> src(256);
  for (uint32_t i = 0; i < src.size(); ++i) src[i] = 1000 + i;
  uint32_t* dSrc = toDevice(src);
  uint32_t* out = toDevice(std::vector<uint32_t>(256));
  for (Wait wait : {Wait::kAll, Wait::kAllButNewest, Wait::kNone}) {
    LAUNCH(cpAsyncKernel, 1, 32)(dSrc, out, wait);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint32_t> got = toHost(out, 256);
    for (int t = 0; t < 32; ++t) {
      const int n = (t + 1) % 32;
      for (int i = 0; i < 4; ++i) {
        const uint32_t first = wait == Wait::kNone ? kStale : src[n * 4 + i];
        const uint32_t second = wait != Wait::kAll ? kStale : n % 2 == 0 ? src[128 + n * 4 + i] : 0u;
        ASSERT_EQ(got[t * 8 + i], first) << "wait " << static_cast<int>(wait) << " thread " << t;
        ASSERT_EQ(got[t * 8 + 4 + i], second) << "wait " << static_cast<int>(wait) << " thread " << t;
      }
    }
  }
  cudaFree(dSrc), cudaFree(out);
}

__global__ void misalignedCpAsyncKernel(const uint32_t* src) {
  alignas(16) __shared__ uint32_t tile[64];
  ptx::cpAsync16(&tile[2], src, true);
}

__global__ void cpAsyncToGlobalKernel(uint32_t* dst, const uint32_t* src) { ptx::cpAsync16(dst, src, true); }

__global__ void misalignedLdmatrixKernel() {
  alignas(16) __shared__ uint16_t tile[16][16];
  uint32_t r[4];
  ptx::ldmatrixX4(r, &tile[threadIdx.x % 16][1]);
}

__global__ void mmaWithALaneGoneKernel() {
  if (threadIdx.x == 31) return;
  const uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float c[4] = {0, 0, 0, 0};
  ptx::mma16816(c, a, b, c);
}

// (Device memory is allocated inside each death test: the forked child's emulated device starts empty.)
TEST(CudasimPtxDeathTest, WhatTheHardwareRefusesStopsWithAMessage) {
  EXPECT_DEATH(
      {
        LAUNCH(misalignedCpAsyncKernel, 1, 32)(toDevice(std::vector<uint32_t>(64)));
        cudaDeviceSynchronize();
      },
      "must be 16-byte aligned");
  EXPECT_DEATH(
      {
        uint32_t* global = toDevice(std::vector<uint32_t>(64));
        LAUNCH(cpAsyncToGlobalKernel, 1, 32)(global + 16, global);
        cudaDeviceSynchronize();
      },
      "destination is device \\(global\\) memory");
  EXPECT_DEATH(
      {
        LAUNCH(misalignedLdmatrixKernel, 1, 32)();
        cudaDeviceSynchronize();
      },
      "must be 16-byte aligned and in shared memory");
  EXPECT_DEATH(
      {
        LAUNCH(mmaWithALaneGoneKernel, 1, 32)();
        cudaDeviceSynchronize();
      },
      "needs all 32 lanes");
}

}  // namespace
