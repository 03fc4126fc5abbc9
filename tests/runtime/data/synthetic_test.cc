#include "runtime/data/synthetic.h"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdio>

#include "runtime/error.h"
#include "runtime/random.h"

namespace cohort::runtime::data {
namespace {

// docs/data.md's synthetic sets written out directly, one element at a time.
float directX(uint64_t seed, int64_t i, int64_t j) {
  int64_t m = mix24(seed, static_cast<uint64_t>(784 * i + j));
  return static_cast<float>(static_cast<double>(m - (1 << 23)) / 16777216.0);
}

int directLabel(uint64_t seed, int64_t i) {
  std::array<int64_t, 10> score{};
  for (int64_t j = 0; j < 784; ++j) {
    int64_t a = static_cast<int64_t>(mix24(seed, static_cast<uint64_t>(784 * i + j))) - (1 << 23);
    for (int64_t c = 0; c < 10; ++c) {
      int64_t w = 2 * static_cast<int64_t>(mix24(3, static_cast<uint64_t>(10 * j + c))) - (1 << 24);
      score[static_cast<size_t>(c)] += a * w;
    }
  }
  int best = 0;
  for (int c = 1; c < 10; ++c) {
    if (score[static_cast<size_t>(c)] > score[static_cast<size_t>(best)]) best = c;
  }
  return best;
}

void expectRowsMatchFormula(const Dataset& d, uint64_t seed, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    for (int64_t j = 0; j < 784; ++j) {
      ASSERT_EQ(d.inputs().at(i * 784 + j), directX(seed, i, j)) << "row " << i << " col " << j;
    }
    ASSERT_EQ(d.targets().at(i), static_cast<float>(directLabel(seed, i))) << "row " << i;
  }
}

TEST(SyntheticMnist, TrainMatchesFormulaAndClassCounts) {
  auto start = std::chrono::steady_clock::now();
  auto train = syntheticMnist(Split::kTrain);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("synthetic train set generated in %.3f s\n", seconds);
  RecordProperty("generation_ms", static_cast<int>(seconds * 1000));

  EXPECT_EQ(train->inputs().shape(), (Shape{60000, 784}));
  EXPECT_EQ(train->targets().shape(), (Shape{60000}));
  EXPECT_EQ(train->sampleShape(), (Shape{784}));
  EXPECT_EQ(train->targetShape(), Shape{});
  EXPECT_EQ(train->numClasses(), 10);
  EXPECT_EQ(train->name(), "synthetic/train");
  expectRowsMatchFormula(*train, 1, 0, 64);
  expectRowsMatchFormula(*train, 1, 59990, 60000);
  expectRowsMatchFormula(*train, 1, 29990, 30010);  // across the two generator threads

  std::array<int64_t, 10> counts{};
  for (int64_t i = 0; i < train->size(); ++i) {
    float y = train->targets().at(i);
    ASSERT_TRUE(y >= 0 && y < 10 && y == static_cast<int>(y)) << y;
    ++counts[static_cast<size_t>(y)];
  }
  std::array<int64_t, 10> expected = {5446, 5877, 5498, 6150, 6252, 6156, 5968, 6129, 6216, 6308};
  EXPECT_EQ(counts, expected);
}

TEST(SyntheticMnist, TestSplit) {
  auto test = syntheticMnist(Split::kTest);
  EXPECT_EQ(test->inputs().shape(), (Shape{10000, 784}));
  EXPECT_EQ(test->name(), "synthetic/test");
  std::array<int64_t, 10> counts{};
  for (int64_t i = 0; i < test->size(); ++i) ++counts[static_cast<size_t>(test->targets().at(i))];
  int64_t total = 0;
  for (int64_t c : counts) {
    EXPECT_GT(c, 0);
    total += c;
  }
  EXPECT_EQ(total, 10000);
  expectRowsMatchFormula(*test, 2, 0, 16);
  expectRowsMatchFormula(*test, 2, 9990, 10000);
}

TEST(SyntheticMnist, RowsPrefixAgreesWithFullSet) {
  auto small = syntheticMnistRows(2, 5);
  EXPECT_EQ(small->size(), 5);
  expectRowsMatchFormula(*small, 2, 0, 5);
  EXPECT_EQ(syntheticMnistRows(2, 0)->size(), 0);
  EXPECT_THROW(syntheticMnistRows(2, -1), InvalidArgument);
}

TEST(SyntheticMnist, InputsAreInRange) {
  auto d = syntheticMnistRows(1, 100);
  for (int64_t e = 0; e < d->inputs().numel(); ++e) {
    ASSERT_GE(d->inputs().at(e), -0.5f);
    ASSERT_LT(d->inputs().at(e), 0.5f);
  }
}

TEST(SyntheticCifar, MatchesFormula) {
  auto d = syntheticCifar(5000);  // large enough to use both generator threads
  EXPECT_EQ(d->inputs().shape(), (Shape{5000, 3, 32, 32}));
  EXPECT_EQ(d->sampleShape(), (Shape{3, 32, 32}));
  EXPECT_EQ(d->numClasses(), 10);
  for (int64_t i : {0, 1, 2499, 2500, 4999}) {
    for (int64_t e = i * 3072; e < (i + 1) * 3072; ++e) {
      ASSERT_EQ(d->inputs().at(e),
                static_cast<float>(mix24(5, static_cast<uint64_t>(e))) / 16777216.0f);
    }
    uint64_t m = mix24(6, static_cast<uint64_t>(i));
    EXPECT_EQ(d->targets().at(i), static_cast<float>((m * 10) >> 24));
  }
  EXPECT_EQ(d->name(), "synthetic-cifar/train");
  EXPECT_THROW(syntheticCifar(-1), InvalidArgument);
  EXPECT_THROW(syntheticCifarSamples(-1, 3), InvalidArgument);
}

// docs/data.md's splitmix64 and m, written out again independently of runtime/random.h.
uint32_t referenceM(uint64_t seed, uint64_t k) {
  uint64_t z = seed * 0xD1B54A32D192ED03ull + (k + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<uint32_t>(z >> 40);
}

TEST(SyntheticCifar, MatchesThePeerBenchmark) {
  // m values and labels printed by bench-peers/cnn_torch.py's splitmix_u24 (numpy) for n = 5000:
  // x = m(5, k) * 2^-24 with k the flat index of x.reshape(n, 3, 32, 32); y = (m(6, i) * 10) >> 24.
  const uint32_t firstM[4] = {5673155, 14137248, 281297, 2722374};
  const float firstLabels[10] = {6, 8, 6, 3, 8, 6, 3, 7, 2, 6};
  auto train = openDataset("synthetic-cifar", Split::kTrain);
  ASSERT_EQ(train->inputs().shape(), (Shape{5000, 3, 32, 32}));
  EXPECT_EQ(train->numClasses(), 10);
  for (int64_t k = 0; k < 4; ++k) {
    EXPECT_EQ(referenceM(5, static_cast<uint64_t>(k)), firstM[k]);
    EXPECT_EQ(train->inputs().at(k), static_cast<float>(firstM[k]) / 16777216.0f) << k;
  }
  EXPECT_EQ(train->inputs().at(0), 0x1.5a430cp-2f);             // the peer's float32, bit for bit
  EXPECT_EQ(train->inputs().at(3072), 12181139 / 16777216.0f);  // sample 1, k = 3072
  EXPECT_EQ(train->inputs().at(2 * 3072 - 1), 12846607 / 16777216.0f);  // x[1, 2, 31, 31]
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(train->targets().at(i), firstLabels[i]) << i;
  for (int64_t k : {int64_t{12345}, int64_t{5000 * 3072 - 1}}) {
    EXPECT_EQ(train->inputs().at(k),
              static_cast<float>(referenceM(5, static_cast<uint64_t>(k))) / 16777216.0f);
  }
  EXPECT_EQ(train->targets().at(4999),
            static_cast<float>((uint64_t{referenceM(6, 4999)} * 10) >> 24));
}

TEST(SyntheticCifar, TestSplitContinuesTheStreamsAfterTheTrainSamples) {
  // The peer's streams at k = 5000 * 3072 and labels 5000 .. 5009.
  const float labels[10] = {3, 7, 4, 2, 4, 7, 7, 2, 5, 7};
  auto test = openDataset("synthetic-cifar", Split::kTest);
  ASSERT_EQ(test->inputs().shape(), (Shape{1000, 3, 32, 32}));
  EXPECT_EQ(test->name(), "synthetic-cifar/test");
  EXPECT_EQ(test->inputs().at(0), 10439818 / 16777216.0f);
  EXPECT_EQ(test->inputs().at(1), 7468474 / 16777216.0f);
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(test->targets().at(i), labels[i]) << i;

  // synthetic-cifar:7's test split is samples 7 .. 1006 of a longer train split.
  auto small = openDataset("synthetic-cifar:7", Split::kTest);
  auto longer = syntheticCifar(1007);
  ASSERT_EQ(small->size(), 1000);
  for (int64_t e = 0; e < 1000 * 3072; ++e)
    ASSERT_EQ(small->inputs().at(e), longer->inputs().at(7 * 3072 + e)) << e;
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(small->targets().at(i), longer->targets().at(7 + i));
  EXPECT_EQ(openDataset("synthetic-cifar:7", Split::kTrain)->size(), 7);
}

TEST(OpenDataset, SpecsAndErrors) {
  EXPECT_EQ(openDataset("synthetic", Split::kTest)->size(), 10000);
  auto msg = [](const std::string& spec, Split split) {
    try {
      openDataset(spec, split);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no InvalidArgument");
  };
  std::string unknown = msg("imagenet:/x", Split::kTrain);
  EXPECT_NE(unknown.find("imagenet:/x"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("mnist:DIR"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("csv:FILE"), std::string::npos) << unknown;
  EXPECT_NE(msg("csv:/x.csv", Split::kTest).find("--test-data csv:FILE"), std::string::npos);
  EXPECT_NE(unknown.find("cifar10:DIR"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("synthetic-cifar:N"), std::string::npos) << unknown;
  for (const char* bad : {"synthetic-cifar:", "synthetic-cifar:0", "synthetic-cifar:-3",
                          "synthetic-cifar:7x", "synthetic-cifar:abc", "synthetic-cifar: 7",
                          "synthetic-cifar:99999999999999999999", "synthetic-cifar:4294967297"}) {
    EXPECT_NE(msg(bad, Split::kTrain).find("must be an integer in [1, 4294967296]"),
              std::string::npos)
        << bad << ": " << msg(bad, Split::kTrain);
  }
  EXPECT_NE(msg("synthetic-cifarx", Split::kTrain).find("unknown dataset spec"), std::string::npos);
  EXPECT_NE(msg("mnist:", Split::kTrain).find("needs a path"), std::string::npos);
  EXPECT_NE(msg("", Split::kTrain).find("unknown dataset spec"), std::string::npos);
}

}  // namespace
}  // namespace cohort::runtime::data
