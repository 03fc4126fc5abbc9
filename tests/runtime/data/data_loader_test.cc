#include "runtime/data/data_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/error.h"

namespace cohort::runtime::data {
namespace {

// Sample i has inputs (i, i + 0.5, -i) and target i (classification) or (i, 2i) (regression), so a
// batch names its samples exactly.
std::unique_ptr<Dataset> numbered(int64_t n, bool regression = false) {
  DatasetContents c;
  c.name = "numbered";
  c.inputs = Tensor::empty(Shape{n, 3}, cpuAllocator());
  c.targets = regression ? Tensor::empty(Shape{n, 2}, cpuAllocator())
                         : Tensor::empty(Shape{n}, cpuAllocator());
  for (int64_t i = 0; i < n; ++i) {
    c.inputs.at(3 * i) = static_cast<float>(i);
    c.inputs.at(3 * i + 1) = static_cast<float>(i) + 0.5f;
    c.inputs.at(3 * i + 2) = -static_cast<float>(i);
    if (regression) {
      c.targets.at(2 * i) = static_cast<float>(i);
      c.targets.at(2 * i + 1) = static_cast<float>(2 * i);
    } else {
      c.targets.at(i) = static_cast<float>(i);
    }
  }
  c.numClasses = regression ? 0 : n;
  return std::make_unique<Dataset>(std::move(c));
}

struct EpochRecord {
  std::vector<int64_t> samples;  // in order
  std::vector<int64_t> batchSizes;
  std::vector<int64_t> batchIndices;
};

// Drains one epoch, checking that inputs and targets agree with the sample they name.
EpochRecord drain(DataLoader& loader, int64_t epoch, int64_t firstBatch = 0) {
  loader.startEpoch(epoch, firstBatch);
  EpochRecord r;
  Batch b;
  while (loader.next(b)) {
    EXPECT_EQ(b.inputs.dim(0), b.size);
    EXPECT_EQ(b.targets.dim(0), b.size);
    for (int64_t s = 0; s < b.size; ++s) {
      auto i = static_cast<int64_t>(b.targets.at(s));
      EXPECT_EQ(b.inputs.at(3 * s), static_cast<float>(i));
      EXPECT_EQ(b.inputs.at(3 * s + 1), static_cast<float>(i) + 0.5f);
      EXPECT_EQ(b.inputs.at(3 * s + 2), -static_cast<float>(i));
      r.samples.push_back(i);
    }
    r.batchSizes.push_back(b.size);
    r.batchIndices.push_back(b.index);
  }
  EXPECT_FALSE(loader.next(b));  // stays done
  return r;
}

// Runs every rank of a world of `w` over one epoch and interleaves their samples back into the
// sampler's global order: position r + s*W is rank r's s-th sample.
std::vector<int64_t> globalOrder(const Dataset& d, int w, DataLoaderOptions options,
                                 int64_t epoch) {
  std::vector<EpochRecord> ranks;
  for (int r = 0; r < w; ++r) {
    options.rank = r;
    options.worldSize = w;
    DataLoader loader(d, options);
    ranks.push_back(drain(loader, epoch));
    EXPECT_EQ(static_cast<int64_t>(ranks.back().samples.size()), loader.samplesPerEpoch());
  }
  std::vector<int64_t> order;
  for (size_t s = 0; s < ranks[0].samples.size(); ++s) {
    for (int r = 0; r < w; ++r) {
      EXPECT_EQ(ranks[static_cast<size_t>(r)].samples.size(), ranks[0].samples.size());
      order.push_back(ranks[static_cast<size_t>(r)].samples[s]);
    }
  }
  return order;
}

TEST(DataLoader, EverySampleOncePerEpochAcrossRanks) {
  for (int w = 1; w <= 4; ++w) {
    for (int64_t n : {0, 1, 2, 3, 5, 10, 13, 64, 101}) {
      auto d = numbered(n);
      std::vector<int64_t> order = globalOrder(*d, w, {.batchSize = 4, .seed = 11}, 3);
      // PyTorch's DistributedSampler: ceil(N/W)*W positions; the first N are a permutation, the
      // padding repeats the order from its beginning (cyclically when N < W).
      int64_t padded = (n + w - 1) / w * w;
      ASSERT_EQ(static_cast<int64_t>(order.size()), padded) << "n=" << n << " w=" << w;
      std::vector<int64_t> count(static_cast<size_t>(n), 0);
      for (int64_t k = 0; k < n; ++k) ++count[static_cast<size_t>(order[static_cast<size_t>(k)])];
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(count[static_cast<size_t>(i)], 1) << "sample " << i;
      for (int64_t k = n; k < padded; ++k) {
        EXPECT_EQ(order[static_cast<size_t>(k)], order[static_cast<size_t>(k % n)])
            << "position " << k;
      }
    }
  }
}

TEST(DataLoader, DropLastTruncatesAcrossRanks) {
  for (int w = 1; w <= 4; ++w) {
    for (int64_t n : {0, 1, 3, 10, 13, 101}) {
      auto d = numbered(n);
      std::vector<int64_t> order =
          globalOrder(*d, w, {.batchSize = 1, .seed = 5, .prefetch = 1, .dropLast = true}, 0);
      ASSERT_EQ(static_cast<int64_t>(order.size()), n / w * w) << "n=" << n << " w=" << w;
      std::vector<int64_t> count(static_cast<size_t>(n), 0);
      for (int64_t i : order) EXPECT_EQ(++count[static_cast<size_t>(i)], 1) << "sample " << i;
    }
  }
}

TEST(DataLoader, UnshuffledShardsMatchPyTorch) {
  auto d = numbered(10);
  DataLoaderOptions o{.batchSize = 2, .shuffle = false, .worldSize = 4};
  // indices 0..9 padded with 0, 1; rank r takes r, r+4, r+8.
  std::vector<std::vector<int64_t>> expected = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
  for (int r = 0; r < 4; ++r) {
    o.rank = r;
    EXPECT_EQ(shardIndices(10, o, 0), expected[static_cast<size_t>(r)]);
    DataLoader loader(*d, o);
    EXPECT_EQ(drain(loader, 0).samples, expected[static_cast<size_t>(r)]);
  }
  o.rank = 3;
  EXPECT_EQ(shardIndices(1, o, 0), (std::vector<int64_t>{0}));  // [0] padded to [0, 0, 0, 0]
  o.dropLast = true;
  EXPECT_EQ(shardIndices(10, o, 0), (std::vector<int64_t>{3, 7}));
  EXPECT_TRUE(shardIndices(3, o, 0).empty());
}

TEST(DataLoader, OrderIsAPureFunctionOfSeedAndEpoch) {
  auto d = numbered(50);
  DataLoader a(*d, {.batchSize = 8, .seed = 42});
  DataLoader b(*d, {.batchSize = 8, .seed = 42, .prefetch = 0});
  DataLoader c(*d, {.batchSize = 8, .seed = 43});
  std::vector<int64_t> e0 = drain(a, 0).samples;
  std::vector<int64_t> e1 = drain(a, 1).samples;
  EXPECT_EQ(drain(b, 1).samples, e1);
  EXPECT_EQ(drain(b, 0).samples, e0);
  EXPECT_EQ(drain(a, 0).samples, e0);  // replaying an epoch gives the same order
  EXPECT_NE(e0, e1);
  EXPECT_NE(drain(c, 0).samples, e0);
  EXPECT_EQ(e0, shardIndices(50, {.batchSize = 8, .seed = 42}, 0));
  std::vector<int64_t> identity(50);
  for (int64_t i = 0; i < 50; ++i) identity[static_cast<size_t>(i)] = i;
  EXPECT_NE(e0, identity);
  DataLoader plain(*d, {.batchSize = 8, .shuffle = false});
  EXPECT_EQ(drain(plain, 7).samples, identity);
}

TEST(DataLoader, ResumeMidEpoch) {
  auto d = numbered(37);
  DataLoader loader(*d, {.batchSize = 5, .seed = 9, .rank = 1, .worldSize = 2});
  ASSERT_EQ(loader.batchesPerEpoch(), 4);  // 19 samples on rank 1: 5 5 5 4
  EpochRecord full = drain(loader, 2);
  for (int64_t k = 0; k <= loader.batchesPerEpoch(); ++k) {
    EpochRecord part = drain(loader, 2, k);
    std::vector<int64_t> tail(full.samples.begin() + std::min<int64_t>(5 * k, 19),
                              full.samples.end());
    EXPECT_EQ(part.samples, tail) << "from batch " << k;
    std::vector<int64_t> indices(full.batchIndices.begin() + k, full.batchIndices.end());
    EXPECT_EQ(part.batchIndices, indices);
  }
  EXPECT_THROW(loader.startEpoch(2, 5), InvalidArgument);
  EXPECT_THROW(loader.startEpoch(2, -1), InvalidArgument);
  EXPECT_THROW(loader.startEpoch(-1), InvalidArgument);
}

TEST(DataLoader, PrefetchDepthDoesNotChangeBatches) {
  auto d = numbered(103, true);
  std::vector<std::vector<float>> reference;
  for (int prefetch : {0, 1, 4}) {
    DataLoader loader(
        *d, {.batchSize = 10, .seed = 3, .rank = 2, .worldSize = 3, .prefetch = prefetch});
    std::vector<std::vector<float>> got;
    for (int64_t epoch : {0, 1}) {
      loader.startEpoch(epoch);
      for (Batch b; loader.next(b);) {
        ASSERT_EQ(b.targets.shape(), (Shape{b.size, 2}));
        got.emplace_back(b.inputs.data(), b.inputs.data() + b.inputs.numel());
        got.emplace_back(b.targets.data(), b.targets.data() + b.targets.numel());
        got.push_back({static_cast<float>(b.index), static_cast<float>(b.size)});
      }
    }
    if (reference.empty()) {
      reference = got;
    } else {
      EXPECT_EQ(got, reference) << "prefetch " << prefetch;
    }
  }
  EXPECT_EQ(reference.size(), 3u * 2 * 4);  // 35 samples per rank: 4 batches per epoch
}

// Issue 15: the slots are allocated up front, so an unbounded depth allocated a slot per requested
// batch (--prefetch 100000000 grew to gigabytes). The depth stops at the batches of this rank's
// epoch, and the batches stay exactly those of a shallow loader.
TEST(DataLoader, PrefetchDepthIsCappedAtTheEpochsBatches) {
  auto d = numbered(23);
  const int kHuge = std::numeric_limits<int>::max();
  EXPECT_EQ(DataLoader(*d, {.batchSize = 1, .prefetch = kHuge}).prefetchDepth(), 23);
  EXPECT_EQ(DataLoader(*d, {.batchSize = 5, .prefetch = kHuge}).prefetchDepth(), 5);
  // Rank 1 of 2 holds 12 samples: 3 batches of 5, 5, 2.
  EXPECT_EQ(DataLoader(*d, {.batchSize = 5, .rank = 1, .worldSize = 2, .prefetch = kHuge})
                .prefetchDepth(),
            3);
  EXPECT_EQ(DataLoader(*d, {.batchSize = 1, .prefetch = 5}).prefetchDepth(), 5);
  EXPECT_EQ(DataLoader(*d, {.batchSize = 1, .prefetch = 0}).prefetchDepth(), 0);
  auto empty = numbered(0);
  EXPECT_EQ(DataLoader(*empty, {.batchSize = 4, .prefetch = kHuge}).prefetchDepth(), 0);

  for (int w : {1, 3}) {
    DataLoaderOptions shallow{.batchSize = 2, .seed = 4, .rank = w - 1, .worldSize = w,
                              .prefetch = 1};
    DataLoaderOptions deep = shallow;
    deep.prefetch = kHuge;
    DataLoader a(*d, shallow), b(*d, deep);
    EXPECT_EQ(b.prefetchDepth(), b.batchesPerEpoch());
    for (int64_t epoch : {0, 1}) {
      EpochRecord x = drain(a, epoch), y = drain(b, epoch);
      EXPECT_EQ(y.samples, x.samples) << "w=" << w << " epoch " << epoch;
      EXPECT_EQ(y.batchIndices, x.batchIndices);
    }
    EXPECT_EQ(drain(b, 2, 3).samples, drain(a, 2, 3).samples) << "resumed, w=" << w;
  }
}

// ... and at prefetchMemoryBytes of slots ahead (a slot holds a full batch), but never below one
// slot ahead, so a batch larger than the budget is still prefetched.
TEST(DataLoader, PrefetchDepthIsCappedByMemory) {
  auto d = numbered(100);  // 3 inputs and 1 target: 16 bytes a sample, 160 a batch of 10
  auto depth = [&](int prefetch, size_t budget) {
    return DataLoader(*d, {.batchSize = 10, .prefetch = prefetch, .prefetchMemoryBytes = budget})
        .prefetchDepth();
  };
  EXPECT_EQ(depth(8, 480), 3);
  EXPECT_EQ(depth(8, 639), 3);
  EXPECT_EQ(depth(8, 640), 4);
  EXPECT_EQ(depth(2, 480), 2);
  EXPECT_EQ(depth(8, 100), 1);
  EXPECT_EQ(depth(8, 0), 1);
  EXPECT_EQ(depth(0, 480), 0);
  EXPECT_EQ(depth(100, size_t{1} << 40), 10);  // then the epoch's 10 batches are the cap
  EXPECT_EQ(DataLoaderOptions{}.prefetchMemoryBytes, size_t{256} << 20);

  DataLoader capped(*d, {.batchSize = 10, .seed = 8, .prefetch = 8, .prefetchMemoryBytes = 0});
  DataLoader synchronous(*d, {.batchSize = 10, .seed = 8, .prefetch = 0});
  EXPECT_EQ(drain(capped, 1).samples, drain(synchronous, 1).samples);
}

TEST(DataLoader, LastBatchSizeAndDropLast) {
  auto d = numbered(23);
  DataLoader keep(*d, {.batchSize = 5});
  EXPECT_EQ(keep.batchesPerEpoch(), 5);
  EXPECT_EQ(keep.samplesPerEpoch(), 23);
  EXPECT_EQ(drain(keep, 0).batchSizes, (std::vector<int64_t>{5, 5, 5, 5, 3}));
  DataLoader drop(*d, {.batchSize = 5, .dropLast = true});
  EXPECT_EQ(drop.batchesPerEpoch(), 4);
  EXPECT_EQ(drop.samplesPerEpoch(), 20);
  EXPECT_EQ(drain(drop, 0).batchSizes, (std::vector<int64_t>{5, 5, 5, 5}));
  DataLoader big(*d, {.batchSize = 1000});
  EXPECT_EQ(drain(big, 0).batchSizes, (std::vector<int64_t>{23}));
  auto empty = numbered(0);
  DataLoader none(*empty, {.batchSize = 4});
  EXPECT_EQ(none.batchesPerEpoch(), 0);
  EXPECT_TRUE(drain(none, 0).samples.empty());
}

TEST(DataLoader, StopsCleanlyMidEpoch) {
  auto d = numbered(1000);
  for (int prefetch : {1, 3}) {
    DataLoader loader(*d, {.batchSize = 7, .prefetch = prefetch});
    Batch b;
    loader.startEpoch(0);
    ASSERT_TRUE(loader.next(b));
    loader.startEpoch(1);  // joins the worker of epoch 0 while it waits for a free slot
    ASSERT_TRUE(loader.next(b));
    EXPECT_EQ(b.index, 0);
    loader.startEpoch(2, 3);
    ASSERT_TRUE(loader.next(b));
    EXPECT_EQ(b.index, 3);
  }  // destroyed with a worker still running
}

TEST(DataLoader, InvalidOptions) {
  auto d = numbered(10);
  auto message = [&](DataLoaderOptions o) {
    try {
      DataLoader loader(*d, o);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no InvalidArgument");
  };
  EXPECT_NE(message({.batchSize = 0}).find("batch size must be 1..1099511627776 (2^40), got 0"), std::string::npos);
  // Issue 33: a batch so large that the counts formed from it overflow (it used to train nothing, exit 0).
  EXPECT_NE(message({.batchSize = INT64_MAX}).find("got 9223372036854775807"), std::string::npos);
  EXPECT_NE(message({.batchSize = -3}).find("batch size"), std::string::npos);
  EXPECT_NE(message({.batchSize = 1, .worldSize = 0}).find("world size must be >= 1"),
            std::string::npos);
  EXPECT_NE(message({.batchSize = 1, .rank = 2, .worldSize = 2}).find("rank 2 is outside [0, 2)"),
            std::string::npos);
  EXPECT_NE(message({.batchSize = 1, .rank = -1}).find("rank -1"), std::string::npos);
  EXPECT_NE(message({.batchSize = 1, .prefetch = -1}).find("prefetch must be >= 0"),
            std::string::npos);
  EXPECT_NE(message({.batchSize = 1, .timeoutSeconds = 0}).find("timeout"), std::string::npos);
  EXPECT_THROW(shardIndices(10, {.batchSize = 0}, 0), InvalidArgument);
}

// Sample i of a [n, 2, 3, 4] dataset holds 100 i + e + 1 at element e (never 0, so padding shows),
// and target i.
std::unique_ptr<Dataset> images(int64_t n) {
  DatasetContents c;
  c.name = "images";
  c.inputs = Tensor::empty(Shape{n, 2, 3, 4}, cpuAllocator());
  c.targets = Tensor::empty(Shape{n}, cpuAllocator());
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t e = 0; e < 24; ++e) c.inputs.at(24 * i + e) = static_cast<float>(100 * i + e + 1);
    c.targets.at(i) = static_cast<float>(i);
  }
  c.numClasses = n;
  return std::make_unique<Dataset>(std::move(c));
}

// Every sample of every batch, by (sample index, values), in order.
std::vector<std::pair<int64_t, std::vector<float>>> samplesOf(DataLoader& loader, int64_t epoch,
                                                              int64_t firstBatch = 0) {
  std::vector<std::pair<int64_t, std::vector<float>>> out;
  loader.startEpoch(epoch, firstBatch);
  constexpr int64_t elems = 24;
  for (Batch b; loader.next(b);) {
    for (int64_t s = 0; s < b.size; ++s) {
      const float* x = b.inputs.data() + s * elems;
      out.emplace_back(static_cast<int64_t>(b.targets.at(s)), std::vector<float>(x, x + elems));
    }
  }
  return out;
}

TEST(DataLoaderAugment, BatchesHoldTheAugmenterOutputForEachSample) {
  auto d = images(30);
  Augmenter augmenter(kStandardAugment, Shape{2, 3, 4});
  DataLoader loader(*d, {.batchSize = 4, .seed = 17, .augment = kStandardAugment});
  int changed = 0;
  for (int64_t epoch : {0, 1}) {
    auto samples = samplesOf(loader, epoch);
    ASSERT_EQ(samples.size(), 30u);
    for (const auto& [i, got] : samples) {
      std::vector<float> expected(24);
      augmenter.apply(augmenter.draw(17, epoch, i), d->inputs().data() + 24 * i, expected.data());
      EXPECT_EQ(got, expected) << "epoch " << epoch << " sample " << i;
      changed +=
          got != std::vector<float>(d->inputs().data() + 24 * i, d->inputs().data() + 24 * (i + 1));
    }
  }
  EXPECT_GT(changed, 40);  // 1 in 162 draws is the identity
}

TEST(DataLoaderAugment, SameBatchesForAnyPrefetchWorldSizeOrResumePoint) {
  auto d = images(30);
  DataLoaderOptions o{.batchSize = 3, .seed = 5, .augment = kStandardAugment};
  DataLoader reference(*d, o);
  auto epoch2 = samplesOf(reference, 2);
  auto epoch3 = samplesOf(reference, 3);
  EXPECT_NE(epoch2, epoch3);
  EXPECT_EQ(samplesOf(reference, 2), epoch2);  // replay
  o.prefetch = 0;
  DataLoader sync(*d, o);
  EXPECT_EQ(samplesOf(sync, 2), epoch2);
  // Resumed at batch 4: the tail of the epoch, augmented the same way.
  auto resumed = samplesOf(sync, 2, 4);
  EXPECT_EQ(resumed, decltype(epoch2)(epoch2.begin() + 12, epoch2.end()));
  // Three ranks see the same augmentation of each sample as one rank does.
  std::map<int64_t, std::vector<float>> byIndex(epoch2.begin(), epoch2.end());
  for (int r = 0; r < 3; ++r) {
    DataLoader shard(
        *d, {.batchSize = 2, .seed = 5, .rank = r, .worldSize = 3, .augment = kStandardAugment});
    for (const auto& [i, got] : samplesOf(shard, 2)) EXPECT_EQ(got, byIndex[i]) << i;
  }
}

TEST(DataLoaderAugment, DisabledLeavesSamplesUntouched) {
  auto d = images(10);
  for (Augment off : {Augment{}, Augment{.cropPadding = 0, .horizontalFlip = false}}) {
    DataLoader loader(*d, {.batchSize = 4, .seed = 2, .augment = off});
    for (const auto& [i, got] : samplesOf(loader, 0)) {
      EXPECT_EQ(got,
                std::vector<float>(d->inputs().data() + 24 * i, d->inputs().data() + 24 * (i + 1)));
    }
  }
}

TEST(DataLoaderAugment, RefusesSamplesThatAreNotImages) {
  auto d = numbered(10);
  try {
    DataLoader loader(*d, {.batchSize = 2, .augment = {.horizontalFlip = true}});
    ADD_FAILURE() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("numbered"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[C, H, W]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
  }
  EXPECT_THROW((DataLoader(*d, {.batchSize = 2, .augment = {.cropPadding = -4}})), InvalidArgument);
}

}  // namespace
}  // namespace cohort::runtime::data
