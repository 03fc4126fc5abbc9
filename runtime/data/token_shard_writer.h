// TokenShardWriter: writes a stream of uint16 token ids as llm.c's token shards (the files
// runtime/data/token_shards.h reads, `tokens:PATTERN`), cut into shards of a fixed number of tokens,
// as llm.c's data scripts write them (`cohort tokenize`, cli/tokenize_command.h).
//
// The stream has two splits, val then train, each optional. Shards are numbered over the whole
// stream, as llm.c's FineWeb script numbers them: "<dir>/<name>_val_000000.bin", then
// "<dir>/<name>_train_000001.bin", ... (train starts at 000000 when there is no val). Each split's
// shards hold shardTokens tokens each but its last, which holds the rest; a document may continue
// from one shard into the next (llm.c's rule). A split that received no tokens has no shard.
//
// Each shard is written through runtime::OutputFile (an O_EXCL|O_NOFOLLOW temporary renamed over
// the target when the shard is complete): its header (256 little-endian int32: magic 20240520,
// version 1, the token count) is written first with a count of 0 and rewritten with the count before
// the rename, so a reader never sees a shard whose header and size disagree. Every write is checked
// (IoError naming the file). The directory must exist.
//
// Ownership: owns the shard being written; a writer destroyed before finish() removes that shard's
// temporary (the shards already complete stay). Thread safety: one thread.
//
//   TokenShardWriter writer({.dir = "out", .name = "corpus", .shardTokens = 100'000'000});
//   writer.beginSplit(TokenSplit::kVal);   writer.append(valTokens);
//   writer.beginSplit(TokenSplit::kTrain); writer.append(trainTokens);
//   std::vector<WrittenShard> shards = writer.finish();
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace cohort::runtime {
class OutputFile;
}

namespace cohort::runtime::data {

enum class TokenSplit { kVal, kTrain };

// "val", "train".
const char* tokenSplitName(TokenSplit split);

struct TokenShardWriterOptions {
  std::string dir;                     // an existing directory
  std::string name;                    // the shards' prefix
  int64_t shardTokens = 100'000'000;   // tokens per shard, 1 to 2^31 - 1 (llm.c's count is an int32)
};

struct WrittenShard {
  std::string path;
  TokenSplit split = TokenSplit::kTrain;
  int64_t tokens = 0;
};

class TokenShardWriter {
 public:
  // InvalidArgument for a shardTokens out of range or an empty name.
  explicit TokenShardWriter(TokenShardWriterOptions options);
  ~TokenShardWriter();
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  // The path of shard `index` of `split`.
  static std::string shardPath(const TokenShardWriterOptions& options, TokenSplit split, int64_t index);

  // Ends the current split's last shard; the next tokens go to `split`. Splits come in order (val,
  // then train); a call that does not change the split does nothing.
  void beginSplit(TokenSplit split);
  // Appends tokens to the current split (train when beginSplit was never called).
  void append(std::span<const uint16_t> tokens);
  // Completes the last shard; returns every shard written, in order.
  const std::vector<WrittenShard>& finish();

  int64_t tokensWritten() const { return total_; }
  // The shards completed so far (renamed into place), in order.
  const std::vector<WrittenShard>& written() const { return written_; }

 private:
  void openShard();
  void closeShard();

  TokenShardWriterOptions options_;
  TokenSplit split_ = TokenSplit::kTrain;
  bool started_ = false;  // beginSplit or append was called
  std::unique_ptr<OutputFile> file_;  // the shard being written; null between shards
  int64_t inShard_ = 0;               // tokens in file_
  int64_t nextIndex_ = 0;             // the next shard's number, over both splits
  int64_t total_ = 0;
  std::vector<WrittenShard> written_;
};

}  // namespace cohort::runtime::data
