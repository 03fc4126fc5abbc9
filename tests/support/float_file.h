// Float32 values in a raw file, for tests whose ranks (forked processes) hand their results to the
// parent: writeFloats by a rank, readFloats by the parent (an empty vector for a missing file).
// Thread safety: none needed (plain functions over files).
#pragma once

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

}  // namespace cohort::testing
