// Utf8Stream: text that arrives in pieces (a tokenizer's tokens) cut where whole characters end, so
// that what `cohort generate` writes at each token is never half a UTF-8 character (GPT-2's byte-level
// tokens split "é" or an emoji across two or more tokens).
//
// push() appends a piece and returns what can be written now: everything but an incomplete UTF-8
// sequence at the end (a lead byte followed by fewer continuation bytes than it announces, at most 3
// bytes), which is held until the next piece completes it. Bytes that cannot become a character (a
// stray continuation byte, a lead byte followed by a non-continuation byte, bytes that are not UTF-8)
// are passed on as they are, never held: the output is the input's bytes, in order, exactly.
// finish() returns what is held (an incomplete sequence at the end of the text). Not thread-safe; the
// returned view lives until the next call.
//
//   Utf8Stream s;
//   s.push("\xc3");   // ""      (the first byte of "é" is held)
//   s.push("\xa9!");  // "é!"
#pragma once

#include <string>
#include <string_view>

namespace cohort::cli {

class Utf8Stream {
 public:
  std::string_view push(std::string_view piece);
  std::string_view finish();

 private:
  std::string held_;  // an incomplete sequence, 0..3 bytes
  std::string out_;
};

// How many bytes of `text` end on a whole character: text.size() less an incomplete UTF-8 sequence
// at its end (see Utf8Stream).
size_t completeUtf8Prefix(std::string_view text);

}  // namespace cohort::cli
