// ThreadPool: every index runs exactly once for thread counts 1..4 and sizes 0, 1, fewer than the
// threads, not divisible by them and large; the chunks follow chunk(); exceptions reach the caller
// and the pool stays usable; concurrent single-threaded GEMMs from the pool's threads are exact.
#include "runtime/cpu/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "runtime/cpu/blas.h"
#include "runtime/error.h"

namespace cohort::runtime::cpu {
namespace {

TEST(ThreadPool, RunsEveryIndexOnce) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 5, 7, 1000}) {
      SCOPED_TRACE(std::to_string(threads) + " threads, n = " + std::to_string(n));
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> calls{0};
      pool.parallelFor(n, [&](int64_t begin, int64_t end, int worker) {
        ASSERT_LT(begin, end);
        ASSERT_EQ(pool.chunk(n, worker), std::make_pair(begin, end));
        for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        calls.fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
      EXPECT_EQ(calls.load(), std::min<int64_t>(n, threads));
    }
  }
}

TEST(ThreadPool, PropagatesTheLowestWorkersExceptionAndStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallelFor(6,
                                [&](int64_t begin, int64_t, int worker) {
                                  if (worker == 2) throw std::runtime_error("worker 2");
                                  if (begin == 2) throw InvalidArgument("worker 1");
                                }),
               InvalidArgument);
  EXPECT_THROW(pool.parallelFor(2,
                                [&](int64_t begin, int64_t, int) {
                                  if (begin == 1) throw std::runtime_error("x");
                                }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  pool.parallelFor(100, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) sum.fetch_add(i);
  });
  EXPECT_EQ(sum.load(), 4950);
  EXPECT_THROW(ThreadPool(0), InvalidArgument);
}

// Several threads calling gemm at once with OpenBLAS at one thread (Conv2d's parallel tiles): every
// result exact, on small-integer data, over many rounds.
TEST(ThreadPool, ConcurrentSingleThreadedGemmsAreExact) {
  BlasThreadsScope scope(1);
  const int threads = 4, m = 50, n = 300, k = 450;
  std::vector<float> a(m * k), b(k * n), expect(m * n, 0.0f);
  for (int i = 0; i < m * k; ++i) a[i] = static_cast<float>(i % 5 - 2);
  for (int i = 0; i < k * n; ++i) b[i] = static_cast<float>(i % 3 - 1);
  for (int i = 0; i < m; ++i) {
    for (int p = 0; p < k; ++p) {
      for (int j = 0; j < n; ++j) expect[i * n + j] += a[i * k + p] * b[p * n + j];
    }
  }
  std::vector<std::vector<float>> c(threads, std::vector<float>(m * n));
  std::atomic<int> wrong{0};
  ThreadPool pool(threads);
  for (int round = 0; round < 50; ++round) {
    pool.parallelFor(threads, [&](int64_t begin, int64_t end, int) {
      for (int64_t t = begin; t < end; ++t) {
        std::vector<float>& out = c[static_cast<size_t>(t)];
        gemm({.m = m, .n = n, .k = k}, a.data(), b.data(), out.data());
        for (int i = 0; i < m * n; ++i) wrong += out[i] != expect[i];
      }
    });
  }
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(blasThreads(), 1);
}

TEST(BlasThreadsScope, RestoresTheCountAlsoOnException) {
  setBlasThreads(2);
  try {
    BlasThreadsScope scope(1);
    EXPECT_EQ(blasThreads(), 1);
    throw std::runtime_error("leave");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(blasThreads(), 2);
  setBlasThreads(1);
}

}  // namespace
}  // namespace cohort::runtime::cpu
