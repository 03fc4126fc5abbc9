// TokenShardWriter (runtime/data/token_shard_writer.h): shards read back by TokenShards as the same
// tokens, cut at shardTokens, numbered over val then train; the header's bytes as llm.c's; a writer
// destroyed mid-shard leaves only its complete shards; a bad shard size refused.
#include "runtime/data/token_shard_writer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/data/token_shards.h"
#include "runtime/error.h"
#include "tests/runtime/data/test_util.h"

namespace cohort::runtime::data {
namespace {

std::vector<std::string> namesIn(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<uint16_t> readAll(const std::string& path) {
  const TokenShards shards = TokenShards::open(path);
  std::vector<uint16_t> tokens(static_cast<size_t>(shards.totalTokens()));
  shards.read(0, 0, shards.totalTokens(), tokens.data());
  return tokens;
}

TEST(TokenShardWriter, WritesSplitsAndShardsThatReadBack) {
  const std::string dir = testing::freshTempDir();
  std::vector<uint16_t> val(7), train(25);
  for (size_t i = 0; i < val.size(); ++i) val[i] = static_cast<uint16_t>(60000 + i);
  for (size_t i = 0; i < train.size(); ++i) train[i] = static_cast<uint16_t>(i * 2500);
  TokenShardWriter writer({.dir = dir, .name = "c", .shardTokens = 10});
  writer.beginSplit(TokenSplit::kVal);
  writer.append(val);
  writer.beginSplit(TokenSplit::kTrain);
  writer.append(std::span(train).first(3));  // appends in any pieces
  writer.append(std::span(train).subspan(3));
  const std::vector<WrittenShard>& shards = writer.finish();
  ASSERT_EQ(shards.size(), 4u);
  EXPECT_EQ(namesIn(dir), (std::vector<std::string>{"c_train_000001.bin", "c_train_000002.bin", "c_train_000003.bin",
                                                    "c_val_000000.bin"}));
  EXPECT_EQ(readAll(dir + "/c_val_000000.bin"), val);
  std::vector<uint16_t> back;
  for (int i = 1; i <= 3; ++i) {
    const std::vector<uint16_t> part = readAll(TokenShardWriter::shardPath({.dir = dir, .name = "c"}, TokenSplit::kTrain, i));
    EXPECT_EQ(part.size(), i < 3 ? 10u : 5u);
    back.insert(back.end(), part.begin(), part.end());
  }
  EXPECT_EQ(back, train);
  EXPECT_EQ(shards[3].tokens, 5);
  EXPECT_EQ(writer.tokensWritten(), 32);
  // llm.c's header, byte for byte: 20240520, 1, the count, then zeros.
  const std::string bytes = [&] {
    std::ifstream in(dir + "/c_val_000000.bin", std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }();
  ASSERT_EQ(bytes.size(), 1024u + 14u);
  int32_t header[256];
  std::memcpy(header, bytes.data(), sizeof header);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 7);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header[i], 0) << i;
}

TEST(TokenShardWriter, TrainAloneStartsAtZeroAndAnUnfinishedShardLeavesNothing) {
  const std::string dir = testing::freshTempDir();
  {
    TokenShardWriter writer({.dir = dir, .name = "t", .shardTokens = 4});
    const std::vector<uint16_t> tokens = {1, 2, 3, 4, 5, 6};
    writer.append(tokens);
  }  // destroyed before finish(): the second shard's temporary is removed
  EXPECT_EQ(namesIn(dir), std::vector<std::string>{"t_train_000000.bin"});
}

TEST(TokenShardWriter, RefusesABadShardSize) {
  for (int64_t bad : {int64_t{0}, int64_t{-1}, int64_t{1} << 31}) {
    const std::string message = testing::messageOf<InvalidArgument>([&] { TokenShardWriter({.dir = ".", .name = "x", .shardTokens = bad}); });
    EXPECT_NE(message.find("tokens per shard"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace cohort::runtime::data
