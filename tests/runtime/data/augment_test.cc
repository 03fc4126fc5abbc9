#include "runtime/data/augment.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/error.h"

namespace cohort::runtime::data {
namespace {

using Image = std::vector<float>;  // C * H * W values, row-major

Image apply(const Augment& a, const Shape& shape, const AugmentDraw& d, const Image& in) {
  Augmenter augmenter(a, shape);
  Image out(in.size(), -1.0f);  // every element must be written
  augmenter.apply(d, in.data(), out.data());
  return out;
}

// A 3 x 3 plane 1 .. 9; padded by p = 1 it is
//   0 0 0 0 0
//   0 1 2 3 0
//   0 4 5 6 0
//   0 7 8 9 0
//   0 0 0 0 0
const Image kPlane = {1, 2, 3, 4, 5, 6, 7, 8, 9};
const Shape kPlaneShape{1, 3, 3};

TEST(Augment, CropPicksTheWindowOfThePaddedSample) {
  Augment crop{.cropPadding = 1};
  EXPECT_EQ(apply(crop, kPlaneShape, {.top = 1, .left = 1}, kPlane), kPlane);  // centred
  EXPECT_EQ(apply(crop, kPlaneShape, {.top = 0, .left = 2}, kPlane),
            (Image{0, 0, 0, 2, 3, 0, 5, 6, 0}));
  EXPECT_EQ(apply(crop, kPlaneShape, {.top = 2, .left = 0}, kPlane),
            (Image{0, 4, 5, 0, 7, 8, 0, 0, 0}));
  EXPECT_EQ(apply(crop, kPlaneShape, {.top = 0, .left = 0}, kPlane),
            (Image{0, 0, 0, 0, 1, 2, 0, 4, 5}));
  EXPECT_EQ(apply({.cropPadding = 2}, kPlaneShape, {.top = 0, .left = 0}, kPlane),
            (Image{0, 0, 0, 0, 0, 0, 0, 0, 1}));
  // Padding beyond the sample's size: a window entirely in the padding, or the sample itself.
  EXPECT_EQ(apply({.cropPadding = 4}, kPlaneShape, {.top = 0, .left = 8}, kPlane), Image(9, 0.0f));
  EXPECT_EQ(apply({.cropPadding = 4}, kPlaneShape, {.top = 4, .left = 4}, kPlane), kPlane);
}

TEST(Augment, FlipMirrorsEachRow) {
  Augment flip{.horizontalFlip = true};
  EXPECT_EQ(apply(flip, kPlaneShape, {.flip = true}, kPlane), (Image{3, 2, 1, 6, 5, 4, 9, 8, 7}));
  EXPECT_EQ(apply(flip, kPlaneShape, {.flip = false}, kPlane), kPlane);
}

TEST(Augment, CropThenFlip) {
  Augment both{.cropPadding = 1, .horizontalFlip = true};
  // The window of CropPicksTheWindowOfThePaddedSample (0 0 0 / 2 3 0 / 5 6 0), mirrored.
  EXPECT_EQ(apply(both, kPlaneShape, {.top = 0, .left = 2, .flip = true}, kPlane),
            (Image{0, 0, 0, 0, 3, 2, 0, 6, 5}));
  // A non-square sample of two channels: 2 x 4 planes, the second one 10 higher.
  //   padded plane 0 rows 1 .. 2, columns 0 .. 3: 0 1 2 3 / 0 5 6 7; mirrored: 3 2 1 0 / 7 6 5 0.
  Image in = {1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 14, 15, 16, 17, 18};
  EXPECT_EQ(apply(both, Shape{2, 2, 4}, {.top = 1, .left = 0, .flip = true}, in),
            (Image{3, 2, 1, 0, 7, 6, 5, 0, 13, 12, 11, 0, 17, 16, 15, 0}));
  EXPECT_EQ(apply(both, Shape{2, 2, 4}, {.top = 0, .left = 2, .flip = false}, in),
            (Image{0, 0, 0, 0, 2, 3, 4, 0, 0, 0, 0, 0, 12, 13, 14, 0}));
}

TEST(Augment, DrawsArePureFunctionsOfSeedEpochAndSample) {
  Augmenter a(kStandardAugment, Shape{3, 32, 32});
  std::vector<int> tops(9), lefts(9);
  int flips = 0;
  int sameAsNextEpoch = 0;
  int sameAsOtherSeed = 0;
  constexpr int kSamples = 4000;
  auto same = [](const AugmentDraw& x, const AugmentDraw& y) {
    return x.top == y.top && x.left == y.left && x.flip == y.flip;
  };
  for (int i = 0; i < kSamples; ++i) {
    AugmentDraw d = a.draw(7, 3, i);
    EXPECT_TRUE(same(d, a.draw(7, 3, i)));
    ASSERT_TRUE(d.top >= 0 && d.top <= 8 && d.left >= 0 && d.left <= 8) << d.top << " " << d.left;
    ++tops[static_cast<size_t>(d.top)];
    ++lefts[static_cast<size_t>(d.left)];
    flips += d.flip;
    sameAsNextEpoch += same(d, a.draw(7, 4, i));
    sameAsOtherSeed += same(d, a.draw(8, 3, i));
  }
  // 162 equally likely outcomes: a repeat in another epoch or seed is rare.
  EXPECT_LT(sameAsNextEpoch, kSamples / 50);
  EXPECT_LT(sameAsOtherSeed, kSamples / 50);
  for (int v = 0; v < 9; ++v) {
    EXPECT_GT(tops[static_cast<size_t>(v)], kSamples / 9 / 2) << v;
    EXPECT_GT(lefts[static_cast<size_t>(v)], kSamples / 9 / 2) << v;
  }
  EXPECT_GT(flips, kSamples * 45 / 100);
  EXPECT_LT(flips, kSamples * 55 / 100);
}

TEST(Augment, DisabledPartsDrawNothingAndKeepTheOthersChoices) {
  Augmenter both(kStandardAugment, Shape{3, 32, 32});
  Augmenter crop({.cropPadding = 4}, Shape{3, 32, 32});
  Augmenter flip({.horizontalFlip = true}, Shape{3, 32, 32});
  for (int i = 0; i < 100; ++i) {
    AugmentDraw b = both.draw(1, 0, i), c = crop.draw(1, 0, i), f = flip.draw(1, 0, i);
    EXPECT_EQ(c.top, b.top);
    EXPECT_EQ(c.left, b.left);
    EXPECT_FALSE(c.flip);
    EXPECT_EQ(f.top, 0);
    EXPECT_EQ(f.left, 0);
    EXPECT_EQ(f.flip, b.flip);
  }
}

TEST(Augment, ValidatesTheOptionsAndTheSampleShape) {
  EXPECT_FALSE(Augment{}.enabled());
  EXPECT_TRUE(kStandardAugment.enabled());
  EXPECT_EQ(kStandardAugment.cropPadding, 4);
  EXPECT_TRUE(kStandardAugment.horizontalFlip);
  Augmenter none(Augment{}, Shape{784});  // disabled: any shape
  EXPECT_FALSE(none.enabled());
  try {
    Augmenter bad(kStandardAugment, Shape{784});
    ADD_FAILURE() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("[C, H, W]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[784]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("random crop with padding 4, horizontal flip"), std::string::npos) << msg;
  }
  EXPECT_THROW((Augmenter({.horizontalFlip = true}, Shape{1, 3, 32, 32})), InvalidArgument);
  EXPECT_THROW((Augmenter({.cropPadding = -1}, Shape{3, 32, 32})), InvalidArgument);
}

}  // namespace
}  // namespace cohort::runtime::data
