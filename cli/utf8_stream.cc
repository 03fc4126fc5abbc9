#include "cli/utf8_stream.h"

namespace cohort::cli {

namespace {

bool isContinuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// The length a lead byte announces: 2, 3 or 4; 0 for a byte that starts no multi-byte sequence.
size_t sequenceLength(unsigned char c) {
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

}  // namespace

size_t completeUtf8Prefix(std::string_view text) {
  // The last lead byte within the last 3 bytes, with only continuation bytes after it.
  const size_t n = text.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(text[n - back]);
    if (isContinuation(c)) continue;
    const size_t length = sequenceLength(c);
    return length > back ? n - back : n;  // incomplete: hold it from its lead byte
  }
  return n;
}

std::string_view Utf8Stream::push(std::string_view piece) {
  out_ = held_;
  out_.append(piece);
  const size_t whole = completeUtf8Prefix(out_);
  held_ = out_.substr(whole);
  out_.resize(whole);
  return out_;
}

std::string_view Utf8Stream::finish() {
  out_.swap(held_);
  held_.clear();
  return out_;
}

}  // namespace cohort::cli
