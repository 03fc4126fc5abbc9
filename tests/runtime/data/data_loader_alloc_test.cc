// Checks DESIGN.md §6 for the data path: in steady state DataLoader::next() allocates nothing, on
// the calling thread or in the prefetch worker, with or without augmentation. This binary replaces
// the global operator new to count.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>

#include "runtime/data/data_loader.h"

namespace {
std::atomic<long> gAllocations{0};
}  // namespace

void* operator new(std::size_t bytes) {
  gAllocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace cohort::runtime::data {
namespace {

TEST(DataLoaderAllocations, NextAllocatesNothingInSteadyState) {
  DatasetContents c;
  c.name = "zeros";
  c.inputs = Tensor::zeros(Shape{500, 4, 4});
  c.targets = Tensor::zeros(Shape{500});
  Dataset d(std::move(c));
  long start = gAllocations.load();
  auto probe = std::make_unique<int>(1);
  ASSERT_GT(gAllocations.load(), start) << "the counting operator new is not in use";
  for (int prefetch : {0, 1, 3}) {
    DataLoader loader(d, {.batchSize = 8, .seed = 1, .prefetch = prefetch});
    loader.startEpoch(0);
    Batch b;
    ASSERT_TRUE(loader.next(b));
    long before = gAllocations.load();
    int64_t batches = 1;
    while (loader.next(b)) ++batches;
    long during = gAllocations.load() - before;
    EXPECT_EQ(batches, loader.batchesPerEpoch());
    EXPECT_EQ(during, 0) << "prefetch " << prefetch;
  }
}

TEST(DataLoaderAllocations, AugmentationAllocatesNothingInSteadyState) {
  DatasetContents c;
  c.name = "images";
  c.inputs = Tensor::zeros(Shape{500, 3, 8, 8});
  c.targets = Tensor::zeros(Shape{500});
  Dataset d(std::move(c));
  for (int prefetch : {0, 2}) {
    DataLoader loader(
        d, {.batchSize = 8, .seed = 1, .prefetch = prefetch, .augment = kStandardAugment});
    loader.startEpoch(1);
    Batch b;
    ASSERT_TRUE(loader.next(b));
    long before = gAllocations.load();
    while (loader.next(b)) {
    }
    EXPECT_EQ(gAllocations.load() - before, 0) << "prefetch " << prefetch;
  }
}

}  // namespace
}  // namespace cohort::runtime::data
