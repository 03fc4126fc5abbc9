// Token shards (issue 32): the tokenized corpora llm.c and nanoGPT write (FineWeb, TinyStories,
// OpenWebText as `*.bin` files of uint16 token ids), read a window at a time, never whole.
//
// Two layouts, chosen per pattern (issue 44: never guessed from a file's first bytes):
//   llm.c  a header of 256 little-endian int32 (magic 20240520, version 1, the token count), then
//          the count's uint16 tokens; the file's size must be 1024 + 2·count.
//   raw    no header: the whole file is uint16 tokens (an even size), as nanoGPT's prepare.py
//          writes them.
// kLlmc (`tokens:PATTERN`, `tokens:llmc:PATTERN`) refuses a file without llm.c's header: one whose
// first bytes look like a damaged header (a magic near llm.c's, or version 1 and a count that fits
// the size) is named as such, naming the field; any other is told to be given as `tokens:raw:`.
// kRaw (`tokens:raw:PATTERN`, also `tokens:nanogpt:`) reads every file as tokens, even one whose
// first tokens happen to spell the magic. (A headerless file was once taken for raw wherever its
// magic differed: a damaged llm.c header, 20240521, was then trained on as 512 tokens.)
//
// TokenShards::open opens every file a pattern matches: a path, or a glob (glob(3): `*`, `?`,
// `[...]`) over shards, in name order, and keeps each open. A window is read with pread(2), not
// through a mapping: a shard truncated while it is read (the file rewritten in place) is then an
// IoError naming it and the window, where a mapping's read past the new end kills the process with
// SIGBUS; and the resident memory never holds more of a corpus than the window being copied (the
// reads go through the page cache, which workers reading the same shards share).
//
// The ids of each window are checked against the vocabulary as the window is read (no pre-scan:
// it read a 100 GB corpus whole, 170 silent seconds, and could not see a shard rewritten after it).
//
// Errors, each one line naming the file: IoError for a file that cannot be opened or read, and for
// one that shrank under a window ("PATH: shrank while being read: tokens [A, B) (bytes X..Y) lie
// past its end, now N bytes (M when opened)"); InvalidArgument for a pattern that matches nothing,
// a bad or damaged header (the field named), a headerless file without `raw:`, a bad size, a file
// without tokens, and an id at or above the vocabulary ("PATH: token I at position P is not below
// the model's vocabulary of V"). Ownership: a TokenShards owns its descriptors (move-only).
// Thread safety: immutable after open (pread keeps no file position), so any number of threads may
// read it concurrently.
//
//   TokenShards shards = TokenShards::open("data/fineweb_train_*.bin", ShardLayout::kLlmc, 50304);
//   shards.copy(0, 1000, 65, window);  // tokens 1000..1064 of the first shard, as floats
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cohort::runtime::data {

enum class ShardLayout { kLlmc, kRaw };

// llm.c's header: 256 little-endian int32, [0] the magic, [1] the version, [2] the token count, the
// rest zero (written by runtime/data/token_shard_writer.h, `cohort tokenize`).
inline constexpr int32_t kLlmcShardMagic = 20240520, kLlmcShardVersion = 1;
inline constexpr int64_t kLlmcShardHeaderBytes = 256 * sizeof(int32_t);

// "llmc", "raw".
const char* shardLayoutName(ShardLayout layout);

class TokenShards {
 public:
  struct Shard {
    std::string path = {};
    ShardLayout layout = ShardLayout::kLlmc;
    int64_t offset = 0;  // the byte the tokens start at: 1024 (llm.c) or 0 (raw)
    int64_t count = 0;   // tokens
  };

  // vocabulary: every id read must be below it (0, or 65536 and more: every uint16 id is).
  static TokenShards open(const std::string& pattern, ShardLayout layout = ShardLayout::kLlmc, int64_t vocabulary = 0);

  TokenShards(TokenShards&&) noexcept;
  TokenShards& operator=(TokenShards&&) noexcept;
  ~TokenShards();

  const std::vector<Shard>& shards() const { return shards_; }
  int64_t totalTokens() const;

  // Tokens [at, at + count) of shard `shard` into out[0, count), read from the file and checked
  // against the vocabulary; InvalidArgument when the range is not inside the shard or an id is not
  // below the vocabulary, IoError when the file no longer holds them (see the top of this file).
  void read(size_t shard, int64_t at, int64_t count, uint16_t* out) const;

  // The same as whole-number floats (what a Dataset holds).
  void copy(size_t shard, int64_t at, int64_t count, float* out) const;

 private:
  struct Files;
  TokenShards();

  std::vector<Shard> shards_;
  int64_t vocabulary_ = 0;
  std::unique_ptr<Files> files_;
};

}  // namespace cohort::runtime::data
