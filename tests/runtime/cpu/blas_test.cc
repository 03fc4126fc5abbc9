// gemm against a naive triple loop for every transpose combination, on small-integer data so the
// results are exact whatever the summation order.
#include "runtime/cpu/blas.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <utility>
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

// gemmBatched against gemm on each product, for every transpose combination, strides with gaps,
// a broadcast operand (stride 0), alpha and beta, and 1 and 2 BLAS threads: integer data, so equal.
TEST(GemmBatched, EqualsGemmOnEachProduct) {
  const int m = 6, n = 5, k = 7, count = 4;
  for (int threads : {1, 2}) {
    BlasThreadsScope scope(threads);
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (int64_t strideB : {int64_t{k * n + 3}, int64_t{0}}) {
          const GemmOptions o{.m = m, .n = n, .k = k, .transA = ta, .transB = tb, .alpha = 0.5f, .beta = 2.0f};
          const GemmBatch batch{.count = count, .strideA = m * k + 1, .strideB = strideB, .strideC = m * n + 2};
          std::vector<float> a(count * (m * k + 1)), b(count * (k * n + 3)), c(count * (m * n + 2)), expect;
          for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
          for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
          for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(i % 3);
          expect = c;
          for (int i = 0; i < count; ++i) {
            gemm(o, a.data() + i * batch.strideA, b.data() + i * strideB, expect.data() + i * batch.strideC);
          }
          gemmBatched(o, batch, a.data(), b.data(), c.data());
          ASSERT_EQ(c, expect) << "threads " << threads << " transA " << ta << " transB " << tb << " strideB " << strideB;
        }
      }
    }
  }
}

TEST(GemmBatched, EmptyProductsScaleCAndBadBatchesAreRefused) {
  std::vector<float> a(8, 1.0f), b(8, 1.0f), c(8, std::nanf(""));
  gemmBatched({.m = 2, .n = 2, .k = 0, .beta = 0.0f}, {.count = 2, .strideC = 4}, a.data(), b.data(), c.data());
  EXPECT_EQ(c, std::vector<float>(8, 0.0f));  // beta == 0 overwrites, NaN included
  std::fill(c.begin(), c.end(), 3.0f);
  gemmBatched({.m = 2, .n = 2, .k = 2, .alpha = 0.0f, .beta = 0.5f}, {.count = 2, .strideC = 4}, a.data(), b.data(),
              c.data());
  EXPECT_EQ(c, std::vector<float>(8, 1.5f));
  gemmBatched({.m = 2, .n = 2, .k = 2}, {.count = 0}, a.data(), b.data(), nullptr);  // nothing to do
  EXPECT_THROW(gemmBatched({.m = 2, .n = 2, .k = 2}, {.count = 2, .strideA = 4, .strideB = 4, .strideC = 3}, a.data(),
                           b.data(), c.data()),
               Error);  // the C matrices would overlap
  EXPECT_THROW(gemmBatched({.m = 2, .n = 2, .k = 2}, {.count = 2, .strideA = -4, .strideC = 4}, a.data(), b.data(),
                           c.data()),
               Error);
}

// parallelRange: the documented chunks, each index once, one chunk with one thread or a small n,
// inline inside another range, and the lowest chunk's exception after every chunk has run.
TEST(ParallelRange, SplitsCoversNestsAndRethrows) {
  BlasThreadsScope two(2);
  EXPECT_EQ(parallelChunks(100000, 1000), 2);
  EXPECT_EQ(parallelChunks(1500, 1000), 1);
  std::vector<int> seen(100000, 0);
  std::vector<std::pair<int64_t, int64_t>> chunks(2);
  parallelRange(100000, 1000, [&](int64_t begin, int64_t end, int chunk) {
    chunks[static_cast<size_t>(chunk)] = {begin, end};
    for (int64_t i = begin; i < end; ++i) ++seen[static_cast<size_t>(i)];
    // Nested: runs inline, as one chunk on this thread.
    parallelRange(10000, 1, [&](int64_t b, int64_t e, int c) {
      EXPECT_EQ(c, 0);
      EXPECT_EQ(e - b, 10000);
    });
  });
  EXPECT_EQ(chunks[0], std::make_pair(int64_t{0}, int64_t{50000}));
  EXPECT_EQ(chunks[1], std::make_pair(int64_t{50000}, int64_t{100000}));
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 100000);
  std::vector<int> ran(2, 0);
  try {
    parallelRange(100000, 1000, [&](int64_t, int64_t, int chunk) {
      ran[static_cast<size_t>(chunk)] = 1;
      COHORT_THROW(InvalidArgument) << "chunk " << chunk;
    });
    ADD_FAILURE() << "no exception";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("chunk 0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ran, std::vector<int>({1, 1}));
  BlasThreadsScope one(1);
  EXPECT_EQ(parallelChunks(100000, 1000), 1);
}

}  // namespace
}  // namespace cohort::runtime::cpu
