// datasetFromArrays: copies, shapes, each refused input with its message, and a round trip
// through a DataLoader.
#include "runtime/data/dataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "runtime/data/data_loader.h"
#include "runtime/error.h"
#include "tests/runtime/data/test_util.h"

namespace cohort::runtime::data {
namespace {

using testing::messageOf;

// Sample i: inputs (i, i + 0.25, -i), target i % 3.
struct Arrays {
  explicit Arrays(int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const auto f = static_cast<float>(i);
      inputs.insert(inputs.end(), {f, f + 0.25f, -f});
      targets.push_back(static_cast<float>(i % 3));
    }
  }
  ArrayData data() const { return {.inputs = inputs, .sampleShape = Shape{3}, .targets = targets, .numClasses = 3}; }
  std::vector<float> inputs, targets;
};

// The message of the InvalidArgument that datasetFromArrays(data) throws.
std::string refusal(const ArrayData& data) {
  return messageOf<InvalidArgument>([&] { datasetFromArrays(data); });
}

void expectHas(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
}

TEST(DatasetFromArrays, CopiesTheArraysIntoTensorsOfTheGivenShapes) {
  Arrays a(5);
  auto d = datasetFromArrays(a.data());
  EXPECT_EQ(d->name(), "arrays");
  EXPECT_EQ(d->size(), 5);
  EXPECT_EQ(d->inputs().shape(), (Shape{5, 3}));
  EXPECT_EQ(d->targets().shape(), (Shape{5}));
  EXPECT_EQ(d->sampleShape(), (Shape{3}));
  EXPECT_EQ(d->targetShape(), Shape{});
  EXPECT_EQ(d->numClasses(), 3);
  a.inputs[0] = 99;  // the dataset owns a copy
  EXPECT_EQ(d->inputs().at(0), 0.0f);
  EXPECT_EQ(d->inputs().at(4), 1.25f);
  EXPECT_EQ(d->targets().at(4), 1.0f);
}

TEST(DatasetFromArrays, ImagesAndRegressionTargets) {
  std::vector<float> x(2 * 1 * 2 * 2), y = {0.5f, -1, 2, 3.5f};
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  auto d = datasetFromArrays(
      {.name = "pairs", .inputs = x, .sampleShape = Shape{1, 2, 2}, .targets = y, .targetShape = Shape{2}});
  EXPECT_EQ(d->name(), "pairs");
  EXPECT_EQ(d->inputs().shape(), (Shape{2, 1, 2, 2}));
  EXPECT_EQ(d->targets().shape(), (Shape{2, 2}));
  EXPECT_EQ(d->numClasses(), 0);
  EXPECT_EQ(d->targets().at(3), 3.5f);
}

TEST(DatasetFromArrays, RefusesZeroSamples) {
  expectHas(refusal({.sampleShape = Shape{3}}), "'arrays' has no samples: inputs is empty");
}

TEST(DatasetFromArrays, RefusesInputsThatAreNotWholeSamples) {
  Arrays a(4);
  a.inputs.pop_back();
  expectHas(refusal(a.data()), "inputs hold 11 values, not a multiple of the sample size 3 (sampleShape [3])");
}

TEST(DatasetFromArrays, RefusesATargetCountThatDoesNotMatch) {
  Arrays a(4);
  a.targets.push_back(0);
  expectHas(refusal(a.data()), "targets hold 5 values but 4 samples with targetShape [] need 4");
  Arrays b(4);
  ArrayData regression = b.data();
  regression.numClasses = 0;
  regression.targetShape = Shape{2};
  expectHas(refusal(regression), "targets hold 4 values but 4 samples with targetShape [2] need 8");
}

TEST(DatasetFromArrays, RefusesLabelsThatAreNotClassIndices) {
  for (float bad : {3.0f, -1.0f, 1.5f}) {
    Arrays a(4);
    a.targets[2] = bad;
    std::string message = refusal(a.data());
    expectHas(message, "of sample 2 is not a class index (an integer in [0, 3))");
  }
}

TEST(DatasetFromArrays, RefusesNonFiniteValuesNamingTheIndex) {
  Arrays a(4);
  a.inputs[7] = std::numeric_limits<float>::quiet_NaN();
  expectHas(refusal(a.data()), "inputs[7] (sample 2) is nan");
  Arrays b(4);
  ArrayData regression = b.data();
  regression.numClasses = 0;
  b.targets[3] = -std::numeric_limits<float>::infinity();
  expectHas(refusal(regression), "targets[3] (sample 3) is -inf");
}

TEST(DatasetFromArrays, RefusesBadShapesAndClassCounts) {
  Arrays a(4);
  ArrayData d = a.data();
  d.sampleShape = Shape{};
  expectHas(refusal(d), "sampleShape is empty");
  d.sampleShape = Shape{3, 0};
  expectHas(refusal(d), "sampleShape [3, 0] has a dimension that is not positive");
  d = a.data();
  d.targetShape = Shape{1};
  expectHas(refusal(d), "targetShape [1] is not supported");
  d = a.data();
  d.numClasses = -2;
  expectHas(refusal(d), "numClasses is -2");
}

TEST(DatasetFromArrays, RoundTripsThroughADataLoader) {
  Arrays a(10);
  auto d = datasetFromArrays(a.data());
  DataLoader loader(*d, {.batchSize = 4, .shuffle = true, .seed = 3});
  loader.startEpoch(0);
  std::vector<int> seen(10, 0);
  Batch b;
  while (loader.next(b)) {
    for (int64_t s = 0; s < b.size; ++s) {
      const float first = b.inputs.at(3 * s);
      const auto i = static_cast<int64_t>(first);
      ASSERT_TRUE(i >= 0 && i < 10) << first;
      EXPECT_EQ(b.inputs.at(3 * s + 1), first + 0.25f);
      EXPECT_EQ(b.inputs.at(3 * s + 2), -first);
      EXPECT_EQ(b.targets.at(s), static_cast<float>(i % 3));
      ++seen[static_cast<size_t>(i)];
    }
  }
  EXPECT_EQ(seen, std::vector<int>(10, 1));
}

}  // namespace
}  // namespace cohort::runtime::data
