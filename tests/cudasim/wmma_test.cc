// cudasim's warp matrix functions (cudasim/include/mma.h): each warp's wmma m16n16k16 product of
// bf16 tiles in either layout, accumulated in fp32 onto C (D may be C), equals the host's; warps of
// one block keep their own fragments; and a load from a pointer the hardware would refuse (not
// 32-byte aligned) stops the program with a message.
#include <gtest/gtest.h>
#include <mma.h>

#include <cmath>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_runtime.h"

namespace {

namespace wmma = nvcuda::wmma;
using Frag16 = __nv_bfloat16;

#define LAUNCH(kernel, grid, block, stream) ::cudasim::Launch(kernel, #kernel, grid, block, 0, stream)

// Warp w: D_w = A_w · B_w + (A_w · B_w + C_w), with A row-major, B row- or column-major (`bColMajor`),
// C read and D written row- or column-major (`cColMajor`). Tiles are 256 elements apart.
template <class LayoutB>
__global__ void twiceKernel(const Frag16* a, const Frag16* b, float* c, bool cColMajor) {
  const int w = threadIdx.x / 32;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, Frag16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, Frag16, LayoutB> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  const wmma::layout_t layout = cColMajor ? wmma::mem_col_major : wmma::mem_row_major;
  wmma::load_matrix_sync(fa, a + w * 256, 16);
  wmma::load_matrix_sync(fb, b + w * 256, 16);
  wmma::load_matrix_sync(acc, c + w * 256, 16, layout);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(c + w * 256, acc, 16, layout);
}

__global__ void misalignedLoadKernel(const Frag16* a) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, Frag16, wmma::row_major> fa;
  wmma::load_matrix_sync(fa, a + 1, 16);
}

template <class T>
T* toDevice(const std::vector<T>& v) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, v.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}

// Values k/8 for small k: exact in bf16, and their products and sums exact in fp32.
float value(int i, int salt) { return static_cast<float>((i * 7 + salt * 13) % 17 - 8) / 8.0f; }

void checkTwoWarps(bool bColMajor, bool cColMajor) {
  const int warps = 2;
  std::vector<float> a(warps * 256), b(warps * 256), c(warps * 256);
  for (int i = 0; i < warps * 256; ++i) a[i] = value(i, 1), b[i] = value(i, 2), c[i] = value(i, 3);
  std::vector<Frag16> a16(a.size()), b16(b.size());
  for (size_t i = 0; i < a.size(); ++i) a16[i] = __float2bfloat16_rn(a[i]), b16[i] = __float2bfloat16_rn(b[i]);
  Frag16 *da = toDevice(a16), *db = toDevice(b16);
  float* dc = toDevice(c);
  if (bColMajor) {
    LAUNCH(twiceKernel<wmma::col_major>, 1, 32 * warps, nullptr)(da, db, dc, cColMajor);
  } else {
    LAUNCH(twiceKernel<wmma::row_major>, 1, 32 * warps, nullptr)(da, db, dc, cColMajor);
  }
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<float> got(c.size());
  ASSERT_EQ(cudaMemcpy(got.data(), dc, got.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int w = 0; w < warps; ++w) {
    auto at = [&](const std::vector<float>& m, int r, int col, bool colMajor) {
      return m[w * 256 + (colMajor ? col * 16 + r : r * 16 + col)];
    };
    for (int i = 0; i < 16; ++i) {
      for (int j = 0; j < 16; ++j) {
        double product = 0;
        for (int k = 0; k < 16; ++k) product += at(a, i, k, false) * at(b, k, j, bColMajor);
        const double want = at(c, i, j, cColMajor) + 2 * product;
        ASSERT_EQ(at(got, i, j, cColMajor), want) << "warp " << w << " (" << i << ", " << j << ")";
      }
    }
  }
  cudaFree(da), cudaFree(db), cudaFree(dc);
}

TEST(CudasimWmma, EachWarpMultipliesItsOwnTilesInEveryLayout) {
  for (bool bColMajor : {false, true}) {
    for (bool cColMajor : {false, true}) checkTwoWarps(bColMajor, cColMajor);
  }
}

TEST(CudasimWmmaDeathTest, AMisalignedLoadStopsWithAMessage) {
  EXPECT_DEATH(
      {
        Frag16* p = toDevice(std::vector<Frag16>(512));
        LAUNCH(misalignedLoadKernel, 1, 32, nullptr)(p);
        cudaDeviceSynchronize();
      },
      "32-byte aligned pointer");
}

}  // namespace
