// Gpt2Pattern: GPT-2's pre-tokenisation, which cuts text into the pieces that byte-pair encoding
// then works on one at a time (nn/tokenizer.h), run by PCRE2's JIT.
//
// The pattern is tiktoken's for GPT-2 (r50k_base):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with \s written out as Unicode's White_Space property, which is what tiktoken's Rust regex means by
// \s (PCRE2's own \s in UCP mode adds U+180E and is not used). The contractions are case-sensitive
// ("'S" is not one), and the lookahead leaves the last of a run of spaces to the word after it.
// Its \p{L} and \p{N} are PCRE2's Unicode tables (Debian's 10.42: Unicode 14).
//
// Any bytes: text is matched with PCRE2_MATCH_INVALID_UTF, where a byte that is not part of valid
// UTF-8 matches nothing; such bytes come back as pieces of their own (`valid` false), so the pieces
// always cover the text exactly, in order.
//
// Ownership: Gpt2Pattern owns the compiled pattern (immutable, shared by any number of threads);
// PieceCursor owns one thread's match state (match data and JIT stack) and is used by one thread at a
// time. Both are move-only handles.
//
//   Gpt2Pattern pattern;
//   PieceCursor cursor(pattern);
//   cursor.reset(text);
//   for (std::string_view piece; cursor.next(piece);) { ... }
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

namespace cohort::nn {

class Gpt2Pattern {
 public:
  Gpt2Pattern();  // compiles and JIT-compiles; COHORT_CHECKs that PCRE2 accepts it
  ~Gpt2Pattern();
  Gpt2Pattern(const Gpt2Pattern&) = delete;
  Gpt2Pattern& operator=(const Gpt2Pattern&) = delete;

 private:
  friend class PieceCursor;
  struct Code;
  std::unique_ptr<Code> code_;
};

class PieceCursor {
 public:
  explicit PieceCursor(const Gpt2Pattern& pattern);
  ~PieceCursor();
  PieceCursor(PieceCursor&&) noexcept;
  PieceCursor& operator=(PieceCursor&&) noexcept;

  // Starts on `text`, which must outlive the calls to next().
  void reset(std::string_view text);
  // The next piece, false at the end of the text. `valid` is false for a run of bytes that is not
  // UTF-8 (matched by no part of the pattern).
  bool next(std::string_view& piece, bool& valid);
  bool next(std::string_view& piece) {
    bool valid = true;
    return next(piece, valid);
  }

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace cohort::nn
