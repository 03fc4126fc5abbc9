// SpikeDetector: the running statistics of one value over a job's recent applied steps (a loss, a
// gradient's norm), and the largest value the spike rule lets through (train/step.h, "Spikes";
// llm.c's outlier detector, with a floor on the deviation).
//
// It keeps the last kSpikeWindow values. limit(z) is mean + z·max(sd, |mean|/100) of them, or +inf
// while fewer than kSpikeHistory were added: a run that diverges in its first steps has no history
// to be a spike against (lower the learning rate; a non-finite value is caught anyway).
// Deterministic: ranks that add the same values compute the same limit bit for bit.
// Thread safety: none (the training thread).
#pragma once

#include <array>
#include <cstddef>

namespace cohort::train {

inline constexpr size_t kSpikeWindow = 128;
inline constexpr size_t kSpikeHistory = 16;

class SpikeDetector {
 public:
  void add(double value);
  double limit(double z) const;
  size_t size() const { return count_ < kSpikeWindow ? count_ : kSpikeWindow; }

 private:
  std::array<double, kSpikeWindow> values_{};
  size_t count_ = 0;  // values added so far; the newest is at (count_ - 1) % kSpikeWindow
};

}  // namespace cohort::train
