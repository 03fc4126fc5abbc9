// gemm against a naive triple loop for every transpose combination, on small-integer data so the
// results are exact whatever the summation order.
#include "runtime/cpu/blas.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "runtime/error.h"

namespace cohort::runtime::cpu {
namespace {

TEST(Gemm, MatchesNaiveForAllTransposes) {
  const int m = 7, n = 5, k = 9;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<float> a(m * k), b(k * n), c(m * n, 1.0f), expect(m * n);
      for (int i = 0; i < m * k; ++i) a[i] = static_cast<float>(i % 7 - 3);
      for (int i = 0; i < k * n; ++i) b[i] = static_cast<float>(i % 5 - 2);
      auto A = [&](int i, int p) { return ta ? a[p * m + i] : a[i * k + p]; };
      auto B = [&](int p, int j) { return tb ? b[j * k + p] : b[p * n + j]; };
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          float s = 0;
          for (int p = 0; p < k; ++p) s += A(i, p) * B(p, j);
          expect[i * n + j] = 2.0f * s + 0.5f * 1.0f;
        }
      }
      gemm({.m = m, .n = n, .k = k, .transA = ta, .transB = tb, .alpha = 2.0f, .beta = 0.5f}, a.data(), b.data(),
           c.data());
      for (int i = 0; i < m * n; ++i) ASSERT_EQ(c[i], expect[i]) << "transA " << ta << " transB " << tb << " at " << i;
    }
  }
}

TEST(Gemm, ThreadsAreSetAndBadCountsRefused) {
  setBlasThreads(1);
  EXPECT_EQ(blasThreads(), 1);
  EXPECT_THROW(setBlasThreads(0), InvalidArgument);
  EXPECT_NE(blasDescription().find("oneDNN"), std::string::npos) << blasDescription();
}

// A product large enough for oneDNN to split between threads, on small-integer data (exact).
void expectExactProduct(int m, int n, int k) {
  std::vector<float> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n), c(static_cast<size_t>(m) * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 5) - 2.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 3) - 1.0f;
  gemm({.m = m, .n = n, .k = k}, a.data(), b.data(), c.data());
  for (int i = 0; i < m; i += 37) {
    for (int j = 0; j < n; j += 41) {
      float s = 0;
      for (int p = 0; p < k; ++p) s += a[static_cast<size_t>(i) * k + p] * b[static_cast<size_t>(p) * n + j];
      ASSERT_EQ(c[static_cast<size_t>(i) * n + j], s) << i << "," << j;
    }
  }
}

// Two threads at once with one BLAS thread each (Conv2d's parallel tiles), then one caller with two.
TEST(Gemm, ConcurrentCallersAndSeveralThreadsAreExact) {
  {
    BlasThreadsScope one(1);
    std::thread other([] { expectExactProduct(300, 280, 260); });
    expectExactProduct(256, 300, 270);
    other.join();
  }
  BlasThreadsScope two(2);
  EXPECT_EQ(blasThreads(), 2);
  expectExactProduct(512, 512, 512);
}

}  // namespace
}  // namespace cohort::runtime::cpu
