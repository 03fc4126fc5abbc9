// Token shards (issue 32): the tokenized corpora llm.c and nanoGPT write (FineWeb, TinyStories,
// OpenWebText as `*.bin` files of uint16 token ids), memory-mapped, never read whole.
//
// Two layouts, chosen per file:
//   llm.c    a header of 256 little-endian int32 (magic 20240520, version 1, the token count), then
//            the count's uint16 tokens; the file's size must be 1024 + 2·count.
//   nanoGPT  no header: the whole file is uint16 tokens (an even size).
// kAuto takes llm.c's where a file opens with its magic and nanoGPT's elsewhere. kLlmc refuses a
// file without the magic; kNanoGpt reads every file as tokens, even one whose first tokens happen
// to spell the magic.
//
// TokenShards::open maps every file a pattern matches: a path, or a glob (glob(3): `*`, `?`,
// `[...]`) over shards, in name order. The mappings are read-only and shared with the page cache,
// so a process's resident memory grows with the pages it touches and has not released (release()),
// not with the shards' size, and workers reading the same shards share their pages.
//
// Errors, each one line naming the file: IoError for a file that cannot be opened or mapped;
// InvalidArgument for a pattern that matches nothing, a bad magic (a named llm.c layout), version,
// count or size, a file without tokens, and (checkVocabulary) a token id at or above the model's
// vocabulary, naming its position. Ownership: a TokenShards owns its mappings (move-only); the
// pointers shards() lends live as long as it does. Thread safety: immutable after open, so any
// number of threads may read it concurrently.
//
//   TokenShards shards = TokenShards::open("data/fineweb_train_*.bin");
//   shards.checkVocabulary(50304);
//   shards.copy(0, 1000, 65, window);  // tokens 1000..1064 of the first shard, as floats
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cohort::runtime::data {

enum class ShardLayout { kAuto, kLlmc, kNanoGpt };

// "auto", "llmc", "nanogpt".
const char* shardLayoutName(ShardLayout layout);

class TokenShards {
 public:
  struct Shard {
    std::string path = {};
    ShardLayout layout = ShardLayout::kAuto;  // the layout it was read as (never kAuto)
    const uint16_t* tokens = nullptr;         // into the mapping
    int64_t count = 0;
  };

  static TokenShards open(const std::string& pattern, ShardLayout layout = ShardLayout::kAuto);

  TokenShards(TokenShards&&) noexcept;
  TokenShards& operator=(TokenShards&&) noexcept;
  ~TokenShards();

  const std::vector<Shard>& shards() const { return shards_; }
  int64_t totalTokens() const;

  // Reads every shard once; throws InvalidArgument naming the file and the position of the first
  // id ≥ vocabulary. A vocabulary of 65536 or more holds every uint16 id, so then nothing is read
  // (a 100 GB corpus would otherwise be read whole before the first step).
  void checkVocabulary(int64_t vocabulary) const;

  // Tokens [at, at + count) of shard `shard` into out[0, count) as whole-number floats (what a
  // Dataset holds); InvalidArgument when the range is not inside the shard.
  void copy(size_t shard, int64_t at, int64_t count, float* out) const;

  // Unmaps from this process the pages that hold tokens [at, at + count) of shard `shard` (inside
  // the shard), and with them the rest of the 2 MB blocks they lie in (what the kernel maps around
  // a read); the pages stay in the page cache and fault back in when read again: a reader that
  // releases what it has read keeps its resident memory flat however much of a corpus it reads.
  // checkVocabulary releases as it goes.
  void release(size_t shard, int64_t at, int64_t count) const;

 private:
  struct Mappings;
  TokenShards();
  // madvise(advice) over the 2 MB blocks holding tokens [at, at + count) of the shard. The mappings
  // are advised MADV_RANDOM (windows are read at random: no read-ahead of megabytes per window).
  void advise(size_t shard, int64_t at, int64_t count, int advice) const;

  std::vector<Shard> shards_;
  std::unique_ptr<Mappings> mappings_;
};

}  // namespace cohort::runtime::data
