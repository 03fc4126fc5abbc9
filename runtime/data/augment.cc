#include "runtime/data/augment.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "runtime/error.h"
#include "runtime/random.h"

namespace cohort::runtime::data {
namespace {

// "random crop with padding 4, horizontal flip", for messages.
std::string describe(const Augment& a) {
  std::string s;
  if (a.cropPadding > 0) s = "random crop with padding " + std::to_string(a.cropPadding);
  if (a.horizontalFlip) s += std::string(s.empty() ? "" : ", ") + "horizontal flip";
  return s;
}

}  // namespace

Augmenter::Augmenter(const Augment& augment, const Shape& sampleShape) : augment_(augment) {
  if (augment.cropPadding < 0) {
    COHORT_THROW(InvalidArgument) << "augmentation: crop padding must be >= 0, got "
                                  << augment.cropPadding;
  }
  if (!augment.enabled()) return;
  if (sampleShape.rank() != 3) {
    COHORT_THROW(InvalidArgument) << "augmentation (" << describe(augment)
                                  << ") needs image samples of shape [C, H, W], but the samples "
                                     "have shape "
                                  << sampleShape.str();
  }
  channels_ = sampleShape[0];
  height_ = sampleShape[1];
  width_ = sampleShape[2];
}

AugmentDraw Augmenter::draw(uint64_t seed, int64_t epoch, int64_t sample) const {
  uint64_t stream = mix(seed, static_cast<uint64_t>(epoch)) ^ kAugmentSalt;
  Rng rng(mix(stream, static_cast<uint64_t>(sample)));
  // Always three draws in this order, so enabling one part never changes the other's choices.
  auto window = static_cast<uint64_t>(2 * augment_.cropPadding + 1);
  AugmentDraw d;
  d.top = static_cast<int64_t>(rng.below(window));
  d.left = static_cast<int64_t>(rng.below(window));
  d.flip = augment_.horizontalFlip && (rng.nextU64() >> 63) != 0;
  return d;
}

// Row by row: a source row outside the sample gives a zero row; otherwise the columns that fall
// inside the sample are copied (reversed when flipping) and the rest are zero. With
// shift = left - p, output column x reads input column x + shift, or W - 1 - x + shift when
// flipped.
void Augmenter::apply(const AugmentDraw& draw, const float* in, float* out) const {
  const int64_t p = augment_.cropPadding;
  const int64_t h = height_;
  const int64_t w = width_;
  const int64_t shift = draw.left - p;
  COHORT_CHECK(draw.top >= 0 && draw.top <= 2 * p && draw.left >= 0 && draw.left <= 2 * p)
      << "draw (" << draw.top << ", " << draw.left << ") outside [0, " << 2 * p << "]";
  // Output columns [begin, end) read inside the sample; the same range with and without the flip.
  const int64_t begin = draw.flip ? std::max<int64_t>(0, shift) : std::max<int64_t>(0, -shift);
  const int64_t end = draw.flip ? std::min(w, w + shift) : std::min(w, w - shift);
  for (int64_t c = 0; c < channels_; ++c) {
    for (int64_t y = 0; y < h; ++y) {
      float* dst = out + (c * h + y) * w;
      const int64_t sy = y + draw.top - p;
      if (sy < 0 || sy >= h || begin >= end) {
        std::fill(dst, dst + w, 0.0f);
        continue;
      }
      const float* src = in + (c * h + sy) * w;
      std::fill(dst, dst + begin, 0.0f);
      if (draw.flip) {
        for (int64_t x = begin; x < end; ++x) dst[x] = src[w - 1 - x + shift];
      } else {
        std::memcpy(dst + begin, src + begin + shift,
                    static_cast<size_t>(end - begin) * sizeof(float));
      }
      std::fill(dst + end, dst + w, 0.0f);
    }
  }
}

}  // namespace cohort::runtime::data
