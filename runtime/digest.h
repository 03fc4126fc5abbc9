// Digest: a 64-bit FNV-1a hash of bytes, for telling apart things that should be equal (ranks'
// settings, a model's layout, a data set) — fast and stable across processes and builds, not
// cryptographic. A value type.
//
//   runtime::Digest d;
//   d.add(bytes.data(), bytes.size());
//   std::string h = d.hex();  // "9f2c…", 16 hex digits
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace cohort::runtime {

class Digest {
 public:
  Digest& add(const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) value_ = (value_ ^ p[i]) * 0x100000001b3ull;
    return *this;
  }
  Digest& add(std::string_view text) { return add(text.data(), text.size()); }
  uint64_t value() const { return value_; }
  std::string hex() const {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(value_));
    return buf;
  }

 private:
  uint64_t value_ = 0xcbf29ce484222325ull;
};

}  // namespace cohort::runtime
