// Token-shard datasets (runtime/data/tokens.h) through openDataset("tokens:..."): windows inside one
// shard with targets shifted by one, the same windows for the same seed, the test split's
// consecutive windows, rows() and a DataLoader over samples made on demand, and the refusals; the
// loader's KeyedOrder for such datasets, which it computes per position instead of tabulating.
#include "runtime/data/tokens.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/data/data_loader.h"
#include "runtime/data/dataset.h"
#include "runtime/error.h"
#include "runtime/process_memory.h"
#include "tests/runtime/data/test_util.h"

namespace cohort::runtime::data {
namespace {

using testing::freshTempDir;
using testing::messageOf;
using testing::writeFile;

// A shard whose token at position i is base + i (mod 1000), so a window's shard and place show.
std::string shardOf(int64_t count, int base, bool llmc) {
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) tokens[static_cast<size_t>(i)] = static_cast<uint16_t>(base + i % 1000);
  std::string bytes(tokens.size() * 2, '\0');
  std::memcpy(bytes.data(), tokens.data(), bytes.size());
  if (!llmc) return bytes;
  int32_t header[256] = {20240520, 1, static_cast<int32_t>(count)};
  return std::string(reinterpret_cast<const char*>(header), sizeof(header)) + bytes;
}

class TokensTest : public ::testing::Test {
 protected:
  void SetUp() override {
    writeFile(dir_ + "/train_000.bin", shardOf(500, 1000, true));
    writeFile(dir_ + "/train_001.bin", shardOf(301, 3000, true));
  }
  std::unique_ptr<Dataset> open(Split split, uint64_t seed = 5, const std::string& spec = "") const {
    return openDataset(spec.empty() ? "tokens:" + dir_ + "/train_*.bin" : spec, split,
                       {.context = 10, .seed = seed, .vocabulary = 5000});
  }
  std::string dir_ = freshTempDir();
};

std::vector<float> sample(const Dataset& d, int64_t i, std::vector<float>* target = nullptr) {
  std::vector<float> x(10), y(10);
  d.read(i, x.data(), y.data());
  if (target) *target = y;
  return x;
}

TEST_F(TokensTest, TrainWindowsLieInsideOneShardWithTheTargetsShiftedByOne) {
  const auto d = open(Split::kTrain);
  EXPECT_FALSE(d->held());
  EXPECT_EQ(d->size(), 499 / 10 + 300 / 10);
  EXPECT_EQ(d->sampleShape(), Shape{10});
  EXPECT_EQ(d->targetShape(), Shape{10});
  EXPECT_EQ(d->numClasses(), 5000);
  std::set<float> starts;
  for (int64_t i = 0; i < d->size(); ++i) {
    std::vector<float> y;
    const std::vector<float> x = sample(*d, i, &y);
    const float shardBase = x[0] >= 3000 ? 3000 : 1000, last = shardBase == 3000 ? 3300 : 1499;
    for (int t = 0; t < 10; ++t) {
      ASSERT_EQ(x[t], x[0] + t) << "window " << i << " crosses a shard's end";
      ASSERT_EQ(y[t], x[0] + t + 1) << "window " << i;
    }
    ASSERT_LE(y[9], last) << "window " << i;
    starts.insert(x[0]);
  }
  EXPECT_GT(starts.size(), 60u) << "the offsets are spread";
  const auto same = open(Split::kTrain), other = open(Split::kTrain, 6);
  int differ = 0;
  for (int64_t i = 0; i < d->size(); ++i) {
    EXPECT_EQ(sample(*same, i), sample(*d, i));
    differ += sample(*other, i) != sample(*d, i);
  }
  EXPECT_GT(differ, d->size() / 2);
}

TEST_F(TokensTest, TheTestSplitTakesEveryShardsConsecutiveWindows) {
  const auto d = open(Split::kTest);
  ASSERT_EQ(d->size(), 49 + 30);
  EXPECT_EQ(sample(*d, 0)[0], 1000);
  EXPECT_EQ(sample(*d, 48)[0], 1480);
  EXPECT_EQ(sample(*d, 49)[0], 3000);
  std::vector<float> y;
  EXPECT_EQ(sample(*d, 78, &y)[0], 3290);
  EXPECT_EQ(y[9], 3300);
  const Dataset::Rows rows = d->rows(47, 3);
  ASSERT_EQ(rows.inputs.shape(), (Shape{3, 10}));
  EXPECT_EQ(rows.inputs.at(20), 3000);
  EXPECT_EQ(rows.targets.at(29), 3010);
}

TEST_F(TokensTest, ADataLoaderGathersSamplesMadeOnDemand) {
  const auto d = open(Split::kTrain);
  DataLoader loader(*d, {.batchSize = 8, .seed = 3});
  loader.startEpoch(0);
  Batch b;
  ASSERT_TRUE(loader.next(b));
  ASSERT_EQ(b.size, 8);
  std::vector<int64_t> samples;
  loader.batchSamples(b.index, samples);
  for (int64_t s = 0; s < b.size; ++s) {
    std::vector<float> y;
    const std::vector<float> x = sample(*d, samples[static_cast<size_t>(s)], &y);
    for (int t = 0; t < 10; ++t) {
      ASSERT_EQ(b.inputs.at(s * 10 + t), x[static_cast<size_t>(t)]);
      ASSERT_EQ(b.targets.at(s * 10 + t), y[static_cast<size_t>(t)]);
    }
  }
}

TEST(KeyedOrder, IsAPermutationThatTheKeyChanges) {
  for (int64_t n : {1, 2, 3, 17, 1000, 4097}) {
    std::vector<int> seen(static_cast<size_t>(n));
    const KeyedOrder order(n, 11, true), other(n, 12, true), identity(n, 11, false);
    int moved = 0, differ = 0;
    for (int64_t p = 0; p < n; ++p) {
      const int64_t i = order.at(p);
      ASSERT_TRUE(i >= 0 && i < n) << n;
      ++seen[static_cast<size_t>(i)];
      moved += i != p;
      differ += other.at(p) != i;
      ASSERT_EQ(identity.at(p), p);
    }
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)], 1) << "n " << n << ", index " << i;
    if (n >= 1000) {
      EXPECT_GT(moved, n * 9 / 10) << n;
      EXPECT_GT(differ, n * 9 / 10) << n;
    }
  }
}

// Samples made on demand: sample i's input is i (as a float pair: high and low 24 bits).
class CountingSource final : public SampleSource {
 public:
  explicit CountingSource(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Shape sampleShape() const override { return Shape{2}; }
  Shape targetShape() const override { return Shape{}; }
  void read(int64_t index, float* input, float* target) const override {
    input[0] = static_cast<float>(index >> 24);
    input[1] = static_cast<float>(index & 0xffffff);
    *target = 0.0f;
  }

 private:
  int64_t n_;
};

Dataset onDemand(int64_t n) {
  DatasetContents c;
  c.name = "counting";
  c.source = std::make_shared<CountingSource>(n);
  return Dataset(std::move(c));
}

// A trillion samples: the loader keeps no table (its resident memory barely moves), two ranks take
// the positions one rank takes, and a resume on another world size continues the same order.
TEST(OnDemandLoader, KeepsNoTableAndShardsOneOrderOverAnyWorldSize) {
  const Dataset data = onDemand(int64_t{1} << 40);
  const size_t before = processMemory().residentBytes;
  const auto firstBatches = [&](int rank, int world, int64_t seen, int batches) {
    DataLoader loader(data, {.batchSize = 4, .seed = 9, .rank = rank, .worldSize = world, .prefetch = 0});
    if (seen == 0) {
      loader.startEpoch(3);
    } else {
      loader.startEpochAfter(3, seen);
    }
    std::vector<std::vector<int64_t>> out;
    Batch b;
    for (int k = 0; k < batches && loader.next(b); ++k) {
      std::vector<int64_t> samples;
      loader.batchSamples(b.index, samples);
      for (int64_t s = 0; s < b.size; ++s) {
        EXPECT_EQ((static_cast<int64_t>(b.inputs.at(2 * s)) << 24) + static_cast<int64_t>(b.inputs.at(2 * s + 1)),
                  samples[static_cast<size_t>(s)]);
      }
      out.push_back(samples);
    }
    return out;
  };
  const auto one = firstBatches(0, 1, 0, 4);                                        // positions 0..15
  const auto r0 = firstBatches(0, 2, 0, 2), r1 = firstBatches(1, 2, 0, 2);          // 0, 2, .. and 1, 3, ..
  const auto resumed = firstBatches(0, 1, 8, 2);                                    // positions 8..15
  std::vector<int64_t> ones, twos, after;
  for (const auto& batch : one) ones.insert(ones.end(), batch.begin(), batch.end());
  for (size_t k = 0; k < 2; ++k) {
    for (size_t i = 0; i < 4; ++i) {
      twos.push_back(r0[k][i]);
      twos.push_back(r1[k][i]);
    }
  }
  for (const auto& batch : resumed) after.insert(after.end(), batch.begin(), batch.end());
  EXPECT_EQ(twos, std::vector<int64_t>(ones.begin(), ones.begin() + 16));
  EXPECT_EQ(after, std::vector<int64_t>(ones.begin() + 8, ones.end()));
  EXPECT_EQ(std::set<int64_t>(ones.begin(), ones.end()).size(), ones.size());
  const size_t grown = processMemory().residentBytes - before;
  EXPECT_LT(grown, size_t{50} << 20) << "the loader tabulated its order";
}

// A small dataset made on demand: an epoch over 3 ranks takes every sample (and pads as the table does).
TEST(OnDemandLoader, AnEpochTakesEverySample) {
  const Dataset data = onDemand(37);
  std::vector<int> seen(37);
  for (int rank = 0; rank < 3; ++rank) {
    DataLoader loader(data, {.batchSize = 5, .seed = 2, .rank = rank, .worldSize = 3});
    loader.startEpoch(0);
    EXPECT_EQ(loader.samplesPerEpoch(), 13);
    for (Batch b; loader.next(b);) {
      std::vector<int64_t> samples;
      loader.batchSamples(b.index, samples);
      for (int64_t s : samples) ++seen[static_cast<size_t>(s)];
    }
  }
  int total = 0;
  for (int count : seen) {
    EXPECT_GE(count, 1);
    total += count;
  }
  EXPECT_EQ(total, 39);  // 37 and the 2 of padding
}

TEST_F(TokensTest, RefusesWhatCannotBeTrainedWithOneLine) {
  writeFile(dir_ + "/short.bin", shardOf(10, 0, true));
  std::string m = messageOf<InvalidArgument>([&] { open(Split::kTrain, 5, "tokens:" + dir_ + "/short.bin"); });
  EXPECT_NE(m.find(dir_ + "/short.bin: 10 tokens, shorter than one window of context + 1 = 11"), std::string::npos) << m;
  // Ids are checked as a window is read (issue 44): the test split's window 58 is tokens [90, 101)
  // of train_001.bin, whose last is 3100; the windows before it read.
  const auto ids = openDataset("tokens:" + dir_ + "/train_*.bin", Split::kTest, {.context = 10, .seed = 1, .vocabulary = 3100});
  std::vector<float> y;
  sample(*ids, 57, &y);
  m = messageOf<InvalidArgument>([&] { sample(*ids, 58); });
  EXPECT_NE(m.find(dir_ + "/train_001.bin: token 3100 at position 100 is not below the model's vocabulary of 3100"),
            std::string::npos)
      << m;
  m = messageOf<InvalidArgument>([&] { openDataset("tokens:" + dir_ + "/train_*.bin", Split::kTrain, {}); });
  EXPECT_NE(m.find("--model gpt:"), std::string::npos) << m;
  // The layout: llm.c's (tokens: or tokens:llmc:) refuses a headerless shard, saying to name it raw;
  // raw (tokens:raw:, or tokens:nanogpt: as before) reads the other's header as tokens.
  writeFile(dir_ + "/raw.bin", shardOf(301, 3000, false));
  for (const char* spec : {"tokens:", "tokens:llmc:"}) {
    m = messageOf<InvalidArgument>([&] { open(Split::kTrain, 5, spec + dir_ + "/raw.bin"); });
    EXPECT_NE(m.find("not an llm.c token shard"), std::string::npos) << m;
    EXPECT_NE(m.find("is read with tokens:raw:PATTERN"), std::string::npos) << m;
  }
  EXPECT_EQ(open(Split::kTest, 5, "tokens:raw:" + dir_ + "/raw.bin")->size(), 30);
  for (const char* spec : {"tokens:raw:", "tokens:nanogpt:"}) {
    EXPECT_EQ(openDataset(spec + dir_ + "/train_000.bin", Split::kTest, {.context = 10, .seed = 1, .vocabulary = 65536})
                  ->size(),
              (512 + 500 - 1) / 10);
  }
  m = messageOf<InvalidArgument>([&] { open(Split::kTrain, 5, "tokens:" + dir_ + "/none_*.bin"); });
  EXPECT_NE(m.find("matches no file"), std::string::npos) << m;
}

}  // namespace
}  // namespace cohort::runtime::data
