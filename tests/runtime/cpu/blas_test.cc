// gemm against a naive triple loop for every transpose combination, on small-integer data so the
// results are exact whatever the summation order.
#include "runtime/cpu/blas.h"

#include <gtest/gtest.h>

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
  EXPECT_NE(blasDescription().find("OpenBLAS"), std::string::npos) << blasDescription();
}

}  // namespace
}  // namespace cohort::runtime::cpu
