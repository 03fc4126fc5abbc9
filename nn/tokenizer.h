// Tokenizer: GPT-2's tokenizer, text to token ids and back (issue 47), from the files GPT-2's users
// have (nn/tokenizer_files.h: llm.c's gpt2_tokenizer.bin, HuggingFace's tokenizer.json or
// vocab.json + merges.txt, tiktoken's .tiktoken; a directory holding one of them).
//
// Encoding is tiktoken's for GPT-2 and gives its ids exactly: the text is cut into pieces by GPT-2's
// pattern (nn/gpt2_pattern.h, PCRE2's JIT), and each piece is byte-pair encoded by rank, a token's
// rank being its id (nn/bpe.h). encode() is tiktoken's encode_ordinary: "<|endoftext|>" in the text
// is ordinary text (seven tokens); encodeWithSpecial() makes each "<|endoftext|>" (every special
// token's text) its one id, as between documents. Any bytes encode, UTF-8 or not (a byte that is not
// part of valid UTF-8 is a piece of its own), and decode(encode(x)) == x for every x.
//
// digest() names the vocabulary (its tokens' bytes, which are special, the end-of-text id): the
// same for the same vocabulary read from any of the formats; FNV-1a 64 in hex, to tell vocabularies
// apart, not a cryptographic hash.
// Errors: read() throws IoError or InvalidArgument naming the file (nn/tokenizer_files.h); encode()
// and encoder() throw InvalidArgument for a vocabulary that decodes but is not a byte-level BPE.
// Ownership and thread safety: a Tokenizer is an immutable, cheaply copied handle on shared state;
// any number of threads may call it. encode() makes a fresh Encoder per call; a thread that encodes
// many texts keeps its own Encoder (one per thread: it holds the match state and a cache of pieces).
//
//   nn::Tokenizer t = nn::Tokenizer::read("gpt2_tokenizer.bin");
//   std::vector<int32_t> ids = t.encode("Hello world");   // {15496, 995}
//   std::string text = t.decode(ids);                     // "Hello world"
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nn/tokenizer_files.h"

namespace cohort::nn {

class Tokenizer {
 public:
  class Encoder;

  Tokenizer() = default;  // empty: size() 0; encode() and decode() are not to be called
  static Tokenizer read(const std::string& pathOrDir);
  // From a vocabulary in memory (nn/tokenizer_files.h). One that is not a byte-level BPE (a byte
  // that is not a token, two tokens with the same bytes) still decodes; encoding it throws
  // InvalidArgument naming the file and why.
  static Tokenizer fromVocabulary(Vocabulary vocabulary);

  int64_t size() const;
  int64_t eotId() const;  // "<|endoftext|>"'s id, -1 when the vocabulary has none
  const std::string& digest() const;
  const Vocabulary& vocabulary() const;

  std::vector<int32_t> encode(std::string_view text) const;
  std::vector<int32_t> encodeWithSpecial(std::string_view text) const;
  // The bytes of token `id`; an id past size() (a vocabulary padded past the tokenizer's, as
  // llm.c pads GPT-2's 50257 to 50304) decodes to "<|id|>".
  std::string decode(int64_t id) const;
  std::string decode(std::span<const int32_t> ids) const;

  Encoder encoder() const;

 private:
  struct State;
  std::shared_ptr<const State> state_;
};

// One thread's encoder: appends to `out` and allocates nothing per piece once its buffers have grown.
class Tokenizer::Encoder {
 public:
  ~Encoder();
  Encoder(Encoder&&) noexcept;
  Encoder& operator=(Encoder&&) noexcept;

  void encode(std::string_view text, std::vector<int32_t>& out);
  void encodeWithSpecial(std::string_view text, std::vector<int32_t>& out);

 private:
  friend class Tokenizer;
  struct Work;
  explicit Encoder(std::shared_ptr<const State> state);
  std::shared_ptr<const State> state_;
  std::unique_ptr<Work> work_;
};

}  // namespace cohort::nn
