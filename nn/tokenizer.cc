#include "nn/tokenizer.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "runtime/error.h"

namespace cohort::nn {

namespace {

constexpr uint32_t kMagic = 20240328;
constexpr size_t kHeaderWords = 256;

}  // namespace

Tokenizer Tokenizer::read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) COHORT_THROW(IoError) << path << ": cannot open: " << std::strerror(errno);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) COHORT_THROW(IoError) << path << ": read failed";
  uint32_t header[kHeaderWords] = {};
  if (bytes.size() < sizeof(header)) {
    COHORT_THROW(InvalidArgument) << path << ": " << bytes.size() << " bytes, shorter than a tokenizer's header of "
                                  << sizeof(header);
  }
  std::memcpy(header, bytes.data(), sizeof(header));
  if (header[0] != kMagic) {
    COHORT_THROW(InvalidArgument) << path << ": not an llm.c tokenizer (magic " << header[0] << ", expected " << kMagic
                                  << ")";
  }
  if (header[1] != 1 && header[1] != 2) {
    COHORT_THROW(InvalidArgument) << path << ": llm.c tokenizer of version " << header[1] << ", expected 1 or 2";
  }
  Tokenizer t;
  t.pieces_.reserve(header[2]);
  size_t at = sizeof(header);
  for (uint32_t id = 0; id < header[2]; ++id) {
    const size_t length = at < bytes.size() ? static_cast<unsigned char>(bytes[at]) : 0;
    if (at >= bytes.size() || at + 1 + length > bytes.size()) {
      COHORT_THROW(InvalidArgument) << path << ": ends inside token " << id << " of the " << header[2]
                                    << " its header counts";
    }
    t.pieces_.push_back(bytes.substr(at + 1, length));
    at += 1 + length;
  }
  return t;
}

std::string Tokenizer::decode(int64_t id) const {
  if (id >= 0 && id < size()) return pieces_[static_cast<size_t>(id)];
  return "<|" + std::to_string(id) + "|>";
}

}  // namespace cohort::nn
