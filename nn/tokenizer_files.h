// The tokenizer files GPT-2's users have, read into one Vocabulary (nn/tokenizer.h builds the
// encoder from it):
//   - llm.c's `gpt2_tokenizer.bin`: a header of 256 little-endian uint32 (magic 20240328, version 1 or
//     2, the vocabulary's size; version 2 adds the end-of-text id), then per token a uint8 length and
//     its bytes;
//   - HuggingFace's `tokenizer.json` (a "BPE" model's "vocab" and "merges", "added_tokens"), or its
//     `vocab.json` with `merges.txt` beside it; their tokens are written with GPT-2's byte-to-character
//     map (gpt2ByteToChar: ' ' is "Ġ"), and merges "a b" in order;
//   - tiktoken's `.tiktoken` rank files: per line the token's bytes in base64, a space and its rank.
//
// Cohort merges by rank, with a token's rank its id (tiktoken's definition of GPT-2), which is the
// order of HuggingFace's merges only when each merge's result has a larger id than the one before;
// merges that are not in that order are refused rather than encoded differently from HuggingFace.
// `<|endoftext|>` is special (never reached by merging ordinary text): llm.c's end-of-text id, a
// HuggingFace special added token, or for a `.tiktoken` file the id after its ranks (as tiktoken's
// GPT-2 adds 50256 after 50256 ranks).
//
// A directory is looked into for, in this order: tokenizer.json, vocab.json (+ merges.txt),
// gpt2_tokenizer.bin, one *.tiktoken. A file's format is told by its content (llm.c's magic; a JSON
// object with "model" or without; else base64 lines).
// Errors: IoError when a file cannot be read; InvalidArgument naming the file and what is wrong with
// it (a bad magic or version, a truncated token, JSON that is not a vocabulary, a token not in GPT-2's
// byte map, a bad base64 line, missing or repeated ranks, merges out of order). Thread safety: free
// functions on their arguments only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cohort::nn {

struct Vocabulary {
  std::vector<std::string> tokens;     // tokens[id]: its bytes
  std::vector<int64_t> specialIds;     // ids encoded only from their text by encodeWithSpecial
  int64_t eotId = -1;                  // "<|endoftext|>", one of specialIds; -1: none
  std::string format;                  // "llm.c", "tokenizer.json", "vocab.json", "tiktoken"
  std::string path;                    // the file read
};

inline constexpr char kEndOfText[] = "<|endoftext|>";

Vocabulary readVocabulary(const std::string& pathOrDir);

// GPT-2's byte-to-character map (HuggingFace's bytes_to_unicode): the printable bytes '!'..'~',
// 0xA1..0xAC and 0xAE..0xFF are their own code point, the other 68 bytes map to U+0100 onwards in
// byte order. Returns the character's UTF-8.
std::string gpt2ByteToChar(unsigned char byte);

}  // namespace cohort::nn
