#include "runtime/data/synthetic.h"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdio>

#include "runtime/error.h"
#include "runtime/random.h"

namespace cohort::runtime::data {
namespace {

// DESIGN.md §7 written out directly, one element at a time.
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
  EXPECT_THROW(syntheticCifar(-1), InvalidArgument);
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
  EXPECT_NE(msg("cifar10:/x", Split::kTrain).find("not supported yet"), std::string::npos);
  EXPECT_NE(msg("mnist:", Split::kTrain).find("needs a path"), std::string::npos);
  EXPECT_NE(msg("", Split::kTrain).find("unknown dataset spec"), std::string::npos);
}

}  // namespace
}  // namespace cohort::runtime::data
