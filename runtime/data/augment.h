// Random data augmentation of image samples [C, H, W]: a random crop of the zero-padded sample back
// to its own size, and a random horizontal flip (mirroring the W axis), in that order, like
// torchvision's RandomCrop(size, padding) followed by RandomHorizontalFlip(0.5).
//
// Augment says what to do; an Augmenter, built for one sample shape, draws the random choices of a
// sample (AugmentDraw) and applies them. The draw is a pure function of (seed, epoch, sample index
// in the dataset): sample i of epoch e uses Rng(mix(mix(seed, e) ^ kAugmentSalt, i)), whose first
// two numbers give top and left by below(2p + 1) and whose third gives the flip by its top bit. It
// does not depend on rank, world size, batch size or prefetch depth, so a resumed run reproduces
// the uninterrupted run's batches, and the stream is apart from the shuffle's Rng(mix(seed, e)).
//
// The padding is zero in the stored values. For normalised inputs (cifar10:DIR) zero is the mean
// colour, not black as in a pipeline that pads before normalising.
// The DataLoader applies it while gathering a batch (DataLoaderOptions::augment); nothing is
// allocated. Thread safety: an Augmenter is immutable; any number of threads may use it.
//
//   Augmenter augmenter(kStandardAugment, Shape{3, 32, 32});
//   augmenter.apply(augmenter.draw(seed, epoch, i), in, out);  // in, out: 3 * 32 * 32 floats
#pragma once

#include <cstdint>

#include "runtime/tensor.h"

namespace cohort::runtime::data {

struct Augment {
  int cropPadding = 0;          // p >= 0; p > 0: crop H x W from the sample padded by p zeros
  bool horizontalFlip = false;  // mirror the W axis with probability 1/2
  bool enabled() const { return cropPadding > 0 || horizontalFlip; }
};

// The usual CIFAR-10 training augmentation: pad by 4, crop back to 32 x 32, flip half the time.
inline constexpr Augment kStandardAugment{.cropPadding = 4, .horizontalFlip = true};

// Separates the augmentation stream from the shuffle's ("augment!" in ASCII).
inline constexpr uint64_t kAugmentSalt = 0x6175676d656e7421ull;

// The random choices for one sample.
struct AugmentDraw {
  int64_t top = 0;   // the crop window's offset in the padded sample, in [0, 2p]; p: no shift
  int64_t left = 0;  // likewise along W
  bool flip = false;
};

class Augmenter {
 public:
  Augmenter() = default;  // disabled
  // Throws InvalidArgument for a negative crop padding, or, when `augment` is enabled, for a
  // sample shape that is not [C, H, W] (the message names the shape).
  Augmenter(const Augment& augment, const Shape& sampleShape);

  bool enabled() const { return augment_.enabled(); }
  const Augment& augment() const { return augment_; }

  // The choices for dataset sample `sample` in `epoch` (see above); top = left = p and flip =
  // false for the parts that are disabled.
  AugmentDraw draw(uint64_t seed, int64_t epoch, int64_t sample) const;

  // out[c][y][x] = padded[c][y + top][x' + left] with x' = W - 1 - x when flip, else x, where
  // padded is `in` with p zeros on every side of each H x W plane. in and out hold C * H * W floats
  // each and must not overlap.
  void apply(const AugmentDraw& draw, const float* in, float* out) const;

 private:
  Augment augment_;
  int64_t channels_ = 0;
  int64_t height_ = 0;
  int64_t width_ = 0;
};

}  // namespace cohort::runtime::data
