#include "train/spike_detector.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace cohort::train {

void SpikeDetector::add(double value) {
  values_[count_ % kSpikeWindow] = value;
  ++count_;
}

// Two passes over at most 128 values, in slot order: exact enough, and the same on every rank.
double SpikeDetector::limit(double z) const {
  const size_t n = size();
  if (n < kSpikeHistory) return std::numeric_limits<double>::infinity();
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += values_[i];
  const double mean = sum / static_cast<double>(n);
  double squares = 0;
  for (size_t i = 0; i < n; ++i) squares += (values_[i] - mean) * (values_[i] - mean);
  const double sd = std::sqrt(squares / static_cast<double>(n));
  return mean + z * std::max(sd, std::abs(mean) / 100);
}

}  // namespace cohort::train
