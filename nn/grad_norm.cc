#include "nn/grad_norm.h"

#include <algorithm>
#include <cstddef>

namespace cohort::nn {

// kLanes independent double accumulators, summed in order at the end: the compiler vectorises the
// lanes without reassociating anything (the result does not depend on the instruction set), and
// 32 of them (eight AVX2 registers) keep the FMA units busy instead of waiting on one chain's latency.
double sumOfSquares(std::span<const float> values) {
  constexpr size_t kLanes = 32;
  double lanes[kLanes] = {};
  const float* v = values.data();
  const size_t n = values.size(), whole = n / kLanes * kLanes;
  for (size_t i = 0; i < whole; i += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) {
      const double x = v[i + l];
      lanes[l] += x * x;
    }
  }
  for (size_t i = whole; i < n; ++i) {
    const double x = v[i];
    lanes[i - whole] += x * x;
  }
  double sum = 0;
  for (double lane : lanes) sum += lane;
  return sum;
}

float clipCoefficient(double norm, float maxNorm) {
  const float coefficient = maxNorm / (static_cast<float>(norm) + 1e-6f);
  return std::min(coefficient, 1.0f);
}

}  // namespace cohort::nn
