// Float32 values in a raw file, for tests whose ranks (forked processes) hand their results to the
// parent: writeFloats by a rank, readFloats by the parent (an empty vector for a missing file), and
// compareFloats to say how far two runs' values are apart.
// Thread safety: none needed (plain functions over files).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

namespace cohort::testing {

// Whether every value was written.
inline bool writeFloats(const std::string& path, std::span<const float> values) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(float)));
  return out.good();
}

inline std::vector<float> readFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

struct FloatDifference {
  size_t bitsDiffer = 0;
  double worstRelative = 0;  // |a - b| / max(|b|, 1e-3)
  // Over the whole vector: max |a - b| / max |b| (the max norm's relative difference) and
  // ||a - b||_2 / ||b||_2 (the Euclidean norm's); 0 when b is all zeros and a equals it.
  double maxNormRelative = 0, l2Relative = 0;
};

// How many of a's values differ from b's in their bits (a and b of one size), the worst relative
// difference among them, and the relative differences of the whole vectors.
inline FloatDifference compareFloats(const std::vector<float>& a, const std::vector<float>& b) {
  FloatDifference d;
  double maxDiff = 0, maxRef = 0, sumDiff2 = 0, sumRef2 = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::fabs(double(a[i]) - b[i]), ref = std::fabs(double(b[i]));
    maxDiff = std::isnan(diff) ? HUGE_VAL : std::max(maxDiff, diff);  // a NaN is as far as can be
    maxRef = std::max(maxRef, ref);
    sumDiff2 += diff * diff;
    sumRef2 += ref * ref;
    if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
    ++d.bitsDiffer;
    d.worstRelative = std::max(d.worstRelative, diff / std::max(ref, 1e-3));
  }
  d.maxNormRelative = maxDiff == 0 ? 0 : maxDiff / maxRef;
  d.l2Relative = sumDiff2 == 0 ? 0 : std::sqrt(sumDiff2 / sumRef2);
  return d;
}

}  // namespace cohort::testing
