// TokenShards (runtime/data/token_shards.h): llm.c's and nanoGPT's token files, written here from
// their published layouts, mapped and read back; every malformed file refused with one line naming
// it; a vocabulary of every uint16 id checked without reading; a 100 GB sparse shard opened and read
// from without its pages becoming resident, and windows released with the pages mapped around them.
#include "runtime/data/token_shards.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/process_memory.h"
#include "tests/runtime/data/test_util.h"

namespace cohort::runtime::data {
namespace {

using testing::freshTempDir;
using testing::messageOf;
using testing::writeFile;

std::string tokenBytes(const std::vector<uint16_t>& tokens) {
  std::string bytes(tokens.size() * 2, '\0');
  std::memcpy(bytes.data(), tokens.data(), bytes.size());
  return bytes;
}

// llm.c's layout: 256 int32 (magic, version, count, zeros), then the tokens.
std::string llmcShard(const std::vector<uint16_t>& tokens, int32_t magic = 20240520, int32_t version = 1,
                      int64_t count = -1) {
  int32_t header[256] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count < 0 ? static_cast<int64_t>(tokens.size()) : count);
  std::string bytes(sizeof(header), '\0');
  std::memcpy(bytes.data(), header, sizeof(header));
  return bytes + tokenBytes(tokens);
}

std::vector<uint16_t> ramp(size_t n, uint16_t first) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(first + i);
  return v;
}

class TokenShardsTest : public ::testing::Test {
 protected:
  std::string dir_ = freshTempDir();
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
};

TEST_F(TokenShardsTest, ReadsBothLayoutsAndTellsThemApart) {
  writeFile(path("a.bin"), llmcShard(ramp(300, 7)));
  writeFile(path("b.bin"), tokenBytes(ramp(5, 40000)));
  const TokenShards llmc = TokenShards::open(path("a.bin"));
  ASSERT_EQ(llmc.shards().size(), 1u);
  EXPECT_EQ(llmc.shards()[0].layout, ShardLayout::kLlmc);
  EXPECT_EQ(llmc.shards()[0].count, 300);
  std::vector<float> window(4);
  llmc.copy(0, 296, 4, window.data());
  EXPECT_EQ(window, (std::vector<float>{303, 304, 305, 306}));
  const TokenShards nano = TokenShards::open(path("b.bin"));
  EXPECT_EQ(nano.shards()[0].layout, ShardLayout::kNanoGpt);
  EXPECT_EQ(nano.totalTokens(), 5);
  nano.copy(0, 0, 2, window.data());
  EXPECT_EQ(window[0], 40000.0f);
  EXPECT_EQ(window[1], 40001.0f);
  // Named, nanoGPT's layout reads even a file with llm.c's magic as tokens.
  const TokenShards forced = TokenShards::open(path("a.bin"), ShardLayout::kNanoGpt);
  EXPECT_EQ(forced.shards()[0].count, 512 + 300);
}

TEST_F(TokenShardsTest, AGlobTakesItsShardsInNameOrder) {
  writeFile(path("train_002.bin"), llmcShard(ramp(3, 200)));
  writeFile(path("train_000.bin"), llmcShard(ramp(4, 0)));
  writeFile(path("train_001.bin"), tokenBytes(ramp(5, 100)));
  writeFile(path("val_000.bin"), llmcShard(ramp(9, 0)));
  const TokenShards shards = TokenShards::open(path("train_*.bin"));
  ASSERT_EQ(shards.shards().size(), 3u);
  EXPECT_EQ(shards.shards()[0].path, path("train_000.bin"));
  EXPECT_EQ(shards.shards()[1].path, path("train_001.bin"));
  EXPECT_EQ(shards.shards()[2].path, path("train_002.bin"));
  EXPECT_EQ(shards.totalTokens(), 12);
  float first = -1;
  shards.copy(2, 0, 1, &first);
  EXPECT_EQ(first, 200.0f);
}

TEST_F(TokenShardsTest, RefusesEveryMalformedFileWithOneLineNamingIt) {
  const auto refusal = [&](const std::string& name, const std::string& bytes, ShardLayout layout = ShardLayout::kAuto) {
    writeFile(path(name), bytes);
    return messageOf<InvalidArgument>([&] { TokenShards::open(path(name), layout); });
  };
  EXPECT_NE(refusal("version.bin", llmcShard(ramp(4, 0), 20240520, 2)).find("version 2, expected 1"), std::string::npos);
  EXPECT_NE(refusal("count.bin", llmcShard(ramp(4, 0), 20240520, 1, 5)).find("counts 5 tokens, but its 1032 bytes hold 4"),
            std::string::npos);
  EXPECT_NE(refusal("odd.bin", tokenBytes(ramp(3, 0)) + "x").find("odd size"), std::string::npos);
  EXPECT_NE(refusal("empty.bin", "").find("holds no tokens"), std::string::npos);
  EXPECT_NE(refusal("header_only.bin", llmcShard({})).find("holds no tokens"), std::string::npos);
  EXPECT_NE(refusal("magic.bin", tokenBytes(ramp(600, 0)), ShardLayout::kLlmc).find("not an llm.c token shard"),
            std::string::npos);
  // Issue 33: what is not a regular file is named as such (the data readers' rule, regular_file.h).
  ::mkdir(path("dir.bin").c_str(), 0755);
  const std::string dir = messageOf<IoError>([&] { TokenShards::open(path("dir.bin")); });
  EXPECT_NE(dir.find(path("dir.bin") + ": is a directory, not a regular file"), std::string::npos) << dir;
  const std::string device = messageOf<IoError>([&] { TokenShards::open("/dev/null"); });
  EXPECT_NE(device.find("/dev/null: is a character device, not a regular file"), std::string::npos) << device;
  const std::string none = messageOf<InvalidArgument>([&] { TokenShards::open(path("nothing_*.bin")); });
  EXPECT_NE(none.find("nothing_*.bin matches no file"), std::string::npos) << none;
  for (const char* name : {"version.bin", "count.bin", "odd.bin", "empty.bin", "magic.bin"}) {
    const std::string m = messageOf<InvalidArgument>([&] {
      TokenShards::open(path(name), std::string(name) == "magic.bin" ? ShardLayout::kLlmc : ShardLayout::kAuto);
    });
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find(path(name)), std::string::npos) << m;
  }
}

TEST_F(TokenShardsTest, ATokenPastTheVocabularyIsNamedByFileAndPosition) {
  std::vector<uint16_t> tokens = ramp(10, 0);
  tokens[7] = 50257;
  writeFile(path("a.bin"), llmcShard(ramp(10, 0)));
  writeFile(path("b.bin"), llmcShard(tokens));
  const TokenShards shards = TokenShards::open(path("*.bin"));
  shards.checkVocabulary(50304);
  const std::string m = messageOf<InvalidArgument>([&] { shards.checkVocabulary(50257); });
  EXPECT_NE(m.find(path("b.bin") + ": token 50257 at position 7 is not below the model's vocabulary of 50257"),
            std::string::npos)
      << m;
  float out[2];
  EXPECT_NE(messageOf<InvalidArgument>([&] { shards.copy(0, 9, 2, out); }).find("tokens [9, 11) are not inside its 10"),
            std::string::npos);
}

// With a vocabulary of 65536 or more every uint16 id is valid, so checkVocabulary reads no token:
// here the file shrinks to nothing under its mapping, where reading any token raises SIGBUS, and
// the check still passes; the same check for a vocabulary of 65535 reads, and dies of it.
TEST_F(TokenShardsTest, AVocabularyOfEveryUint16IdIsCheckedWithoutReadingAToken) {
  writeFile(path("gone.bin"), tokenBytes(ramp(65536, 0)));
  const TokenShards shards = TokenShards::open(path("gone.bin"));
  std::filesystem::resize_file(path("gone.bin"), 0);
  EXPECT_EXIT(
      {
        shards.checkVocabulary(65536);
        shards.checkVocabulary(int64_t{1} << 40);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(shards.checkVocabulary(65535), ::testing::KilledBySignal(SIGBUS), "");
}

// A 100 GB shard (sparse: nothing is written) opens and serves windows from its far end while the
// process's resident memory grows by at most a few pages: the shard is mapped, not read.
TEST_F(TokenShardsTest, AHundredGigabyteShardIsMappedNotRead) {
  const int64_t bytes = int64_t{100} << 30;
  writeFile(path("big.bin"), llmcShard(ramp(1, 0), 20240520, 1, 0));
  std::filesystem::resize_file(path("big.bin"), static_cast<uintmax_t>(bytes));
  const size_t before = processMemory().residentBytes;
  // The header's count (0) no longer matches: read it headerless, as nanoGPT's layout.
  const TokenShards shards = TokenShards::open(path("big.bin"), ShardLayout::kNanoGpt);
  EXPECT_EQ(shards.totalTokens(), bytes / 2);
  std::vector<float> window(1025);
  for (int64_t at = bytes / 2 - 1025; at > 0; at -= bytes / 20) shards.copy(0, at, 1025, window.data());
  const size_t grown = processMemory().residentBytes - before;
  std::printf("100 GB shard: resident memory grew by %.1f MB\n", static_cast<double>(grown) / 1e6);
  EXPECT_LT(grown, size_t{50} << 20);
  std::filesystem::remove(path("big.bin"));
}

// Checking a 4 GB shard's ids reads all of it; its pages are released as it goes, so the peak
// resident memory grows by a chunk, not by the shard. Windows read and released keep it flat too.
TEST_F(TokenShardsTest, ReadingAShardReleasesItsPages) {
  const int64_t bytes = int64_t{4} << 30;
  writeFile(path("zeros.bin"), "");
  std::filesystem::resize_file(path("zeros.bin"), static_cast<uintmax_t>(bytes));
  const TokenShards shards = TokenShards::open(path("zeros.bin"));
  const size_t before = processMemory().peakResidentBytes;
  shards.checkVocabulary(1);
  std::vector<float> window(1025);
  for (int64_t at = 0; at + 1025 < bytes / 2; at += 65537) {
    shards.copy(0, at, 1025, window.data());
    shards.release(0, at, 1025);
  }
  const size_t grown = processMemory().peakResidentBytes - before;
  std::printf("4 GB shard read whole: peak resident memory grew by %.1f MB\n", static_cast<double>(grown) / 1e6);
  EXPECT_LT(grown, size_t{50} << 20);
  std::filesystem::remove(path("zeros.bin"));
}

// Windows read at random and released leave nothing of the shard mapped. A fault maps the pages
// around the one it reads too (fault-around: 64 KB by default), so releasing only each window's own
// pages left up to 60 KB per window resident: here 30 MB after 4096 windows over a 256 MB shard
// whose pages are all in the page cache (read once by checkVocabulary); nothing since.
TEST_F(TokenShardsTest, WindowsReadAndReleasedLeaveNoPageAroundThemMapped) {
  const int64_t bytes = int64_t{256} << 20, tokens = bytes / 2, window = 17;
  writeFile(path("zeros.bin"), "");
  std::filesystem::resize_file(path("zeros.bin"), static_cast<uintmax_t>(bytes));
  const TokenShards shards = TokenShards::open(path("zeros.bin"));
  shards.checkVocabulary(1);
  const auto before = static_cast<int64_t>(processMemory().residentBytes);
  std::vector<float> out(window);
  uint64_t state = 1;  // a linear congruential sequence of start positions
  for (int i = 0; i < 4096; ++i) {
    state = state * 6364136223846793005u + 1442695040888963407u;
    const auto at = static_cast<int64_t>((state >> 16) % static_cast<uint64_t>(tokens - window));
    shards.copy(0, at, window, out.data());
    shards.release(0, at, window);
  }
  const int64_t grown = static_cast<int64_t>(processMemory().residentBytes) - before;
  std::printf("4096 windows read and released: resident memory grew by %.1f MB\n", static_cast<double>(grown) / 1e6);
  EXPECT_LT(grown, int64_t{8} << 20);
  std::filesystem::remove(path("zeros.bin"));
}

}  // namespace
}  // namespace cohort::runtime::data
