// nn::Embedding on the CPU: the gather, the weight gradient (finite differences and an exact
// reference), repeated ids, Pass::accumulateGrads, the input gradient, bad ids, determinism and
// the initialisation. The GPU path is compared with this one in tests/nn/gpu/gpu_embedding_test.cc.
#include "nn/embedding.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "tests/nn/grad_check.h"

namespace cohort::nn {
namespace {

using testing::bindParams;
using testing::randomTensor;

Tensor idsTensor(const Shape& shape, const std::vector<float>& ids) {
  Tensor t = Tensor::zeros(shape);
  EXPECT_EQ(t.numel(), static_cast<int64_t>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) t.at(static_cast<int64_t>(i)) = ids[i];
  return t;
}

// Whether two tensors hold the same bits.
bool sameBits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

TEST(EmbeddingTest, ForwardGathersTheRows) {
  Embedding emb({.vocab = 5, .dim = 3});
  ParamBuffer params;
  bindParams(emb, params, 1);
  const Tensor ids = idsTensor(Shape{2, 3}, {4, 0, 2, 2, 1, 4});
  const Tensor& y = emb.forward(ids, Pass{});
  ASSERT_EQ(y.shape(), (Shape{2, 3, 3}));
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const auto row = static_cast<int64_t>(ids.at(i));
    for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(y.at(i * 3 + d), emb.weight().at(row * 3 + d)) << i << ", " << d;
  }
  EXPECT_EQ(params.entries().at(0).name, "weight");
}

TEST(EmbeddingTest, OutputShapeAppendsDim) {
  Embedding emb({.vocab = 7, .dim = 4});
  EXPECT_EQ(emb.outputShape(Shape{}), (Shape{4}));
  EXPECT_EQ(emb.outputShape(Shape{9}), (Shape{9, 4}));
  EXPECT_EQ(emb.outputShape(Shape{2, 3, 5}), (Shape{2, 3, 5, 4}));
  EXPECT_THROW(emb.outputShape(Shape{1, 1, 1, 1, 1, 1}), InvalidArgument);
  EXPECT_THROW(Embedding({.vocab = 0, .dim = 4}), InvalidArgument);
  EXPECT_THROW(Embedding({.vocab = 3, .dim = 4, .initStd = -1.0f}), InvalidArgument);
}

TEST(EmbeddingTest, WeightGradientMatchesFiniteDifferences) {
  // Ids cannot be perturbed (they must stay whole), so only the weight is checked; repeated ids
  // and an unused row (3) are in the batch.
  Embedding emb({.vocab = 6, .dim = 5, .initStd = 0.5f});
  ParamBuffer params;
  bindParams(emb, params, 2);
  const Tensor ids = idsTensor(Shape{2, 4}, {1, 5, 1, 0, 2, 4, 1, 5});
  testing::checkModuleGradients(emb, params, ids, {.checkInput = false});
}

TEST(EmbeddingTest, RepeatedIdsAccumulateInPositionOrder) {
  Embedding emb({.vocab = 4, .dim = 3});
  ParamBuffer params;
  bindParams(emb, params, 3);
  const Tensor ids = idsTensor(Shape{5}, {2, 0, 2, 2, 3});
  emb.forward(ids, Pass{});
  const Tensor dy = randomTensor(Shape{5, 3}, 4);
  params.grads().fill(7.0f);  // stale: overwriting must not see it
  Pass pass;
  pass.needInputGrad = false;
  emb.backward(dy, pass);
  // The reference: each row's positions added in increasing order, starting from 0.
  std::vector<float> want(4 * 3, 0.0f);
  for (int64_t i = 0; i < 5; ++i) {
    const auto row = static_cast<int64_t>(ids.at(i));
    for (int64_t d = 0; d < 3; ++d) want[static_cast<size_t>(row * 3 + d)] += dy.at(i * 3 + d);
  }
  for (int64_t k = 0; k < 12; ++k) EXPECT_EQ(emb.weightGrad().at(k), want[static_cast<size_t>(k)]) << k;
  for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(emb.weightGrad().at(1 * 3 + d), 0.0f) << "unused row 1";

  // Accumulating adds the same sums onto what is there; untouched rows keep their values.
  params.grads().fill(0.5f);
  pass.accumulateGrads = true;
  emb.backward(dy, pass);
  for (int64_t k = 0; k < 12; ++k) {
    float acc = 0.5f;
    const int64_t row = k / 3, d = k % 3;
    for (int64_t i = 0; i < 5; ++i) {
      if (static_cast<int64_t>(ids.at(i)) == row) acc += dy.at(i * 3 + d);
    }
    EXPECT_EQ(emb.weightGrad().at(k), acc) << k;
  }
  EXPECT_EQ(emb.weightGrad().at(1 * 3), 0.5f) << "unused row 1 must be left alone";
}

TEST(EmbeddingTest, InputGradientIsZeroOrAbsent) {
  Embedding emb({.vocab = 4, .dim = 2});
  ParamBuffer params;
  bindParams(emb, params, 5);
  const Tensor ids = idsTensor(Shape{3}, {3, 1, 3});
  emb.forward(ids, Pass{});
  const Tensor dy = randomTensor(Shape{3, 2}, 6);
  Pass pass;
  const Tensor& dx = emb.backward(dy, pass);
  ASSERT_TRUE(dx.defined());
  ASSERT_EQ(dx.shape(), ids.shape());
  for (int64_t i = 0; i < dx.numel(); ++i) EXPECT_EQ(dx.at(i), 0.0f);
  pass.needInputGrad = false;
  EXPECT_FALSE(emb.backward(dy, pass).defined());
}

TEST(EmbeddingTest, BadIdsAreRefusedWithPositionAndValue) {
  Embedding emb({.vocab = 10, .dim = 2});
  ParamBuffer params;
  bindParams(emb, params, 7);
  struct Bad {
    float id;
    std::string value;
  };
  for (const Bad& bad : {Bad{2.5f, "2.5"}, Bad{10.0f, "10"}, Bad{-1.0f, "-1"}, Bad{NAN, "nan"}, Bad{INFINITY, "inf"},
                         Bad{1e30f, "1e+30"}}) {
    const Tensor ids = idsTensor(Shape{2, 3}, {0, 9, 3, 4, bad.id, 5});
    try {
      emb.forward(ids, Pass{});
      ADD_FAILURE() << "id " << bad.value << " was accepted";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("position 4"), std::string::npos) << what;
      EXPECT_NE(what.find("is " + bad.value + ","), std::string::npos) << what;
      EXPECT_NE(what.find("[0, 10)"), std::string::npos) << what;
    }
  }
  // The first bad position is the one named.
  try {
    emb.forward(idsTensor(Shape{4}, {1, 11, 0.5f, 2}), Pass{});
    ADD_FAILURE() << "bad ids were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("position 1 "), std::string::npos) << e.what();
  }
  emb.checkIds(Pass{});  // the CPU path threw already: nothing more to say
}

TEST(EmbeddingTest, BackwardIsBitwiseDeterministic) {
  // Many positions on few rows, so the sums are long and any change of order would show.
  Embedding emb({.vocab = 7, .dim = 33});
  ParamBuffer params;
  bindParams(emb, params, 8);
  Tensor ids = Tensor::zeros(Shape{4, 250});
  runtime::Rng rng(9);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.at(i) = std::floor(rng.uniform(0.0f, 7.0f));
  const Tensor dy = randomTensor(Shape{4, 250, 33}, 10);
  Pass pass;
  pass.needInputGrad = false;
  emb.forward(ids, pass);
  emb.backward(dy, pass);
  const Tensor first = params.grads().clone();
  emb.forward(ids, pass);
  emb.backward(dy, pass);
  EXPECT_TRUE(sameBits(first, params.grads()));
}

TEST(EmbeddingTest, InitialisationIsNormalWithTheGivenStd) {
  for (float std : {0.02f, 0.5f}) {
    Embedding emb({.vocab = 200, .dim = 50, .initStd = std});
    ParamBuffer params;
    bindParams(emb, params, 11);
    double sum = 0, sumSq = 0;
    const int64_t n = emb.weight().numel();
    for (int64_t i = 0; i < n; ++i) {
      sum += emb.weight().at(i);
      sumSq += double(emb.weight().at(i)) * emb.weight().at(i);
    }
    const double mean = sum / n, sd = std::sqrt(sumSq / n - mean * mean);
    EXPECT_NEAR(mean, 0.0, 4 * std / std::sqrt(double(n))) << std;
    EXPECT_NEAR(sd, std, 0.03 * std) << std;
  }
}

TEST(EmbeddingTest, EmptyIdsGiveAnEmptyOutputAndZeroGradient) {
  Embedding emb({.vocab = 3, .dim = 2});
  ParamBuffer params;
  bindParams(emb, params, 12);
  const Tensor ids = Tensor::zeros(Shape{0});
  EXPECT_EQ(emb.forward(ids, Pass{}).shape(), (Shape{0, 2}));
  params.grads().fill(1.0f);
  Pass pass;
  pass.needInputGrad = false;
  emb.backward(Tensor::zeros(Shape{0, 2}), pass);
  for (int64_t k = 0; k < params.grads().numel(); ++k) EXPECT_EQ(params.grads().at(k), 0.0f);
}

}  // namespace
}  // namespace cohort::nn
