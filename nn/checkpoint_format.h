// The safetensors layout shared by nn/checkpoint.cc (writing) and nn/checkpoint_reader.cc
// (reading): the reserved keys, the header CRC and the one-line refusals. Internal to //nn:checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "nn/checkpoint.h"
#include "runtime/error.h"

namespace cohort::nn::detail {

// ordered_json keeps the header's key order, so tensors of zero bytes (which share an offset with
// their neighbour) come back in the order they were written.
using Json = nlohmann::ordered_json;

constexpr size_t kMaxSyscallBytes = size_t{1} << 30;  // also ISA-L's limit: its length is an int
constexpr size_t kReadChunkBytes = size_t{8} << 20;   // CRC each chunk while it is still in cache
constexpr char kMetadataKey[] = "__metadata__";
constexpr char kFormatKey[] = "format";
constexpr char kCrcPrefix[] = "crc32c.";
constexpr char kHeaderCrcKey[] = "header_crc32c";

using TensorShapes = std::vector<std::pair<std::string, runtime::Shape>>;

// Escapes everything but printable ASCII and caps the length, so a message stays one readable line
// whatever a corrupt file holds (nlohmann quotes the offending token, which may be megabytes).
std::string oneLine(const std::string& text);

// Collects "<path>: <problem>" with operator<< and throws it as a one-line IoError at the end of
// the full expression:  Refusal(path) << "header length " << n << " is absurd";
class Refusal {
 public:
  explicit Refusal(const std::string& path) { os_ << path << ": "; }
  template <class T>
  Refusal& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  [[noreturn]] ~Refusal() noexcept(false) { throw IoError(oneLine(os_.str())); }

 private:
  std::ostringstream os_;
};

// Throws "<path>: <what>: <errno text>", reading errno before anything can clobber it.
[[noreturn]] void refuseWithErrno(const std::string& path, const std::string& what);

std::string hex8(uint32_t v);

// [begin, end) as "bytes begin..end".
std::string byteRange(uint64_t begin, uint64_t end);

// True for the metadata keys a Cohort checkpoint reserves ("format", "header_crc32c", "crc32c.*").
bool isReservedKey(const std::string& key);

// CRC32C of the header's meaning, independent of key order, whitespace and data layout: the
// compact, key-sorted JSON
//   {"metadata":{every key but header_crc32c},"tensors":{name:{"dtype":"F32","shape":[...]}}}
// that Python's json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=False) produces.
// Throws nlohmann's type_error for strings that are not UTF-8.
uint32_t headerCrc(const TensorShapes& shapes, const Metadata& metadata);

}  // namespace cohort::nn::detail
