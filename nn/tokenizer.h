// Tokenizer: the byte strings of a vocabulary's tokens, from llm.c's tokenizer file
// (`gpt2_tokenizer.bin`), to print what a GPT with GPT-2's vocabulary generates (issue 32).
//
// The file: a header of 256 little-endian uint32 (magic 20240328, version 1 or 2, the vocabulary's
// size; version 2 adds the end-of-text id), then for each token a uint8 length and that many bytes.
// Decoding only: turning text into GPT-2's tokens needs its BPE merges, which the file does not hold.
// Errors: IoError when the file cannot be read; InvalidArgument naming the file for a bad magic or
// version, or a file that ends before its last token. Thread safety: immutable after read().
//
//   nn::Tokenizer t = nn::Tokenizer::read("gpt2_tokenizer.bin");
//   std::string text = t.decode(15496) + t.decode(995);  // "Hello" " world"
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cohort::nn {

class Tokenizer {
 public:
  static Tokenizer read(const std::string& path);

  int64_t size() const { return static_cast<int64_t>(pieces_.size()); }
  // The bytes of token `id`; an id past size() (a vocabulary padded past the tokenizer's, as
  // llm.c pads GPT-2's 50257 to 50304) prints as "<|id|>".
  std::string decode(int64_t id) const;

 private:
  std::vector<std::string> pieces_;
};

}  // namespace cohort::nn
