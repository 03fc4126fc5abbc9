// Checks docs/architecture.md's "Performance principles" for the data path: in steady state
// DataLoader::next() allocates nothing, on the calling thread or in the prefetch worker, with or
// without augmentation. The counting operator new comes from //tests/support:alloc_counter.
#include <gtest/gtest.h>

#include <memory>

#include "runtime/data/data_loader.h"
#include "tests/support/alloc_counter.h"

namespace cohort::runtime::data {
namespace {

TEST(DataLoaderAllocations, NextAllocatesNothingInSteadyState) {
  DatasetContents c;
  c.name = "zeros";
  c.inputs = Tensor::zeros(Shape{500, 4, 4});
  c.targets = Tensor::zeros(Shape{500});
  Dataset d(std::move(c));
  long start = cohort::testing::allocationCount();
  auto probe = std::make_unique<int>(1);
  ASSERT_GT(cohort::testing::allocationCount(), start) << "the counting operator new is not in use";
  for (int prefetch : {0, 1, 3}) {
    DataLoader loader(d, {.batchSize = 8, .seed = 1, .prefetch = prefetch});
    loader.startEpoch(0);
    Batch b;
    ASSERT_TRUE(loader.next(b));
    long before = cohort::testing::allocationCount();
    int64_t batches = 1;
    while (loader.next(b)) ++batches;
    long during = cohort::testing::allocationCount() - before;
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
    long before = cohort::testing::allocationCount();
    while (loader.next(b)) {
    }
    EXPECT_EQ(cohort::testing::allocationCount() - before, 0) << "prefetch " << prefetch;
  }
}

}  // namespace
}  // namespace cohort::runtime::data
