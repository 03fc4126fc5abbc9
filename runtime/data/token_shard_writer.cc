#include "runtime/data/token_shard_writer.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "runtime/data/token_shards.h"
#include "runtime/error.h"
#include "runtime/output_file.h"

namespace cohort::runtime::data {
namespace {

constexpr int64_t kMaxShardTokens = INT32_MAX;

std::array<int32_t, kLlmcShardHeaderBytes / sizeof(int32_t)> llmcHeader(int64_t count) {
  std::array<int32_t, kLlmcShardHeaderBytes / sizeof(int32_t)> header{};
  header[0] = kLlmcShardMagic;
  header[1] = kLlmcShardVersion;
  header[2] = static_cast<int32_t>(count);
  return header;
}

}  // namespace

const char* tokenSplitName(TokenSplit split) { return split == TokenSplit::kVal ? "val" : "train"; }

TokenShardWriter::TokenShardWriter(TokenShardWriterOptions options) : options_(std::move(options)) {
  if (options_.shardTokens < 1 || options_.shardTokens > kMaxShardTokens) {
    COHORT_THROW(InvalidArgument) << "tokens per shard must be 1 to " << kMaxShardTokens << " (llm.c's count is an int32), not "
                                  << options_.shardTokens;
  }
  if (options_.name.empty()) COHORT_THROW(InvalidArgument) << "token shards need a name";
}

TokenShardWriter::~TokenShardWriter() = default;

std::string TokenShardWriter::shardPath(const TokenShardWriterOptions& options, TokenSplit split, int64_t index) {
  char number[32];
  std::snprintf(number, sizeof number, "%06lld", static_cast<long long>(index));
  return options.dir + "/" + options.name + "_" + tokenSplitName(split) + "_" + number + ".bin";
}

void TokenShardWriter::beginSplit(TokenSplit split) {
  if (started_ && split == split_) return;
  COHORT_CHECK(!started_ || split_ == TokenSplit::kVal) << "splits come val, then train";
  if (file_) closeShard();
  split_ = split;
  started_ = true;
}

void TokenShardWriter::append(std::span<const uint16_t> tokens) {
  started_ = true;
  while (!tokens.empty()) {
    if (!file_) openShard();
    const auto n = static_cast<size_t>(std::min<int64_t>(options_.shardTokens - inShard_, static_cast<int64_t>(tokens.size())));
    file_->write(tokens.data(), n * sizeof(uint16_t));  // little-endian hosts, as llm.c writes them
    inShard_ += static_cast<int64_t>(n);
    total_ += static_cast<int64_t>(n);
    tokens = tokens.subspan(n);
    if (inShard_ == options_.shardTokens) closeShard();
  }
}

const std::vector<WrittenShard>& TokenShardWriter::finish() {
  if (file_) closeShard();
  return written_;
}

void TokenShardWriter::openShard() {
  file_ = std::make_unique<OutputFile>(shardPath(options_, split_, nextIndex_), OutputFileOptions{});
  const auto header = llmcHeader(0);  // the count is written when the shard is complete
  file_->write(header.data(), sizeof header);
  inShard_ = 0;
}

void TokenShardWriter::closeShard() {
  const auto header = llmcHeader(inShard_);
  const char* bytes = reinterpret_cast<const char*>(header.data());
  for (size_t done = 0; done < sizeof header;) {
    const ssize_t n = ::pwrite(file_->fd(), bytes + done, sizeof header - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      COHORT_THROW(IoError) << file_->path() << ": cannot write its header to " << file_->temporaryPath() << ": "
                            << (n < 0 ? std::strerror(errno) : "no progress");
    }
    done += static_cast<size_t>(n);
  }
  file_->commit();
  written_.push_back({.path = file_->path(), .split = split_, .tokens = inShard_});
  file_.reset();
  ++nextIndex_;
  inShard_ = 0;
}

}  // namespace cohort::runtime::data
