// Sharded checkpoints (nn/sharded_checkpoint.h): round trips for world sizes 1 to 4, resharding,
// generations and their cleanup, refusals of missing or corrupt files, and planted symbolic links.
#include "nn/sharded_checkpoint.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "tests/nn/sharded_checkpoint_fixture.h"

namespace cohort::nn {
namespace {

using namespace testing;  // tests/nn/sharded_checkpoint_fixture.h

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

TEST(ShardedCheckpoint, RoundTripsForEveryWorldSize) {
  for (int w : {1, 2, 3, 4}) {
    TempDir dir;
    const std::string path = dir.file("run.st");
    writeGeneration(path, w, 7, {{"step", "70"}});
    for (int r = 0; r < w; ++r) {
      EXPECT_EQ(testing::fileMode(shardFilePath(path, 7, r, w)), S_IFREG | 0600) << "W " << w << " rank " << r;
    }
    EXPECT_EQ(testing::fileMode(path), S_IFREG | 0600);
    const Checkpoint ckpt = readShardedCheckpoint(path);
    expectGeneration(ckpt, 7);
    EXPECT_EQ(ckpt.metadata, (Metadata{{"step", "70"}})) << "W " << w;
    expectGeneration(readAnyCheckpoint(path), 7);
    const ShardedManifest manifest = readShardedManifest(path);
    EXPECT_EQ(manifest.generation, 7u);
    EXPECT_EQ(manifest.worldSize, w);
    EXPECT_EQ(manifest.tensors, testTensorNames());
    ASSERT_EQ(manifest.files.size(), static_cast<size_t>(w));
    EXPECT_EQ(manifest.files.back().path, shardFilePath(path, 7, w - 1, w));
    EXPECT_EQ(committedShardGeneration(path), 7u);
  }
}

TEST(ShardedCheckpoint, CommitTakesTheFilesTheRanksReport) {
  TempDir dir;
  const std::string path = dir.file("run.st");
  std::vector<ShardFile> files;
  for (int r = 0; r < 3; ++r) {
    const ShardMap map = testMap(3, r);
    files.push_back(writeShardFile(map, {.path = path, .generation = 1, .shards = testShards(map, 1)}));
  }
  commitShardedCheckpoint(testMap(3, 0), {.path = path, .generation = 1, .tensors = testTensorNames(), .files = files});
  expectGeneration(readShardedCheckpoint(path), 1);
  // A file that changed after its rank reported it is not committed.
  const ShardMap map = testMap(3, 1);
  files[1] = writeShardFile(map, {.path = path, .generation = 2, .shards = testShards(map, 2)});
  for (int r : {0, 2}) files[r] = writeShardFile(testMap(3, r), {.path = path, .generation = 2, .shards = testShards(testMap(3, r), 2)});
  writeShardFile(map, {.path = path, .generation = 2, .shards = testShards(map, 3)});
  expectThrowNaming<IoError>(
      [&] {
        commitShardedCheckpoint(testMap(3, 0), {.path = path, .generation = 2, .tensors = testTensorNames(), .files = files});
      },
      {shardFilePath(path, 2, 1, 3), "changed"});
  expectGeneration(readShardedCheckpoint(path), 1);
}

TEST(ShardedCheckpoint, ReshardsToOtherWorldSizesBitForBit) {
  TempDir dir;
  const std::string path = dir.file("run.st");
  writeGeneration(path, 2, 5);
  for (int w : {1, 2, 3, 4}) {
    for (int r = 0; r < w; ++r) {
      const ShardMap map = testMap(w, r);
      const std::vector<NamedTensor> got = readReshardedShards(path, map);
      ASSERT_EQ(got.size(), testTensorNames().size());
      const std::vector<NamedTensor> want = testShards(map, 5);  // pack of the flat buffer, padding 0
      for (size_t t = 0; t < got.size(); ++t) {
        EXPECT_EQ(got[t].name, want[t].name);
        ASSERT_EQ(got[t].tensor.numel(), want[t].tensor.numel());
        EXPECT_EQ(std::memcmp(got[t].tensor.data(), want[t].tensor.data(), want[t].tensor.bytes()), 0)
            << want[t].name << " for rank " << r << " of " << w;
      }
    }
  }
  // Other units over the same elements reshard too; another number of elements is another model.
  const ShardMap oneUnit({{"all", 33}}, {.worldSize = 3, .rank = 2});
  std::vector<float> want(oneUnit.shardNumel());
  oneUnit.pack(testing::flatBuffer(5, 0, 33).data(), 2, want.data());
  EXPECT_TRUE(testing::sameFloats(readReshardedShards(path, oneUnit)[0].tensor, want));
  expectThrowNaming<InvalidArgument>([&] { readReshardedShards(path, ShardMap({{"all", 32}}, {.worldSize = 2})); },
                                     {path, "32"});
}

TEST(ShardedCheckpoint, SplitsIntoTheModelsParametersAndReadsPlainCheckpoints) {
  TempDir dir;
  const std::string path = dir.file("run.st");
  writeGeneration(path, 3, 2);
  const std::vector<ParamBuffer::Entry> entries = {{"fc.weight", {3, 4}, 0, 12}, {"fc.bias", {4}, 16, 4}};
  const Checkpoint ckpt = readAnyCheckpoint(path, {.split = entries});
  ASSERT_EQ(ckpt.tensors.size(), 4u);
  const std::vector<float> flat = testing::flatBuffer(2, 0, 33);
  EXPECT_EQ(ckpt.tensors[0].name, "fc.weight");
  EXPECT_EQ(ckpt.tensors[0].tensor.shape(), runtime::Shape({3, 4}));
  EXPECT_TRUE(testing::sameFloats(ckpt.tensors[0].tensor, std::vector<float>(flat.begin(), flat.begin() + 12)));
  EXPECT_TRUE(testing::sameFloats(ckpt.tensors[1].tensor, std::vector<float>(flat.begin() + 16, flat.begin() + 20)));
  EXPECT_EQ(ckpt.tensors[2].name, "optimizer.exp_avg");
  EXPECT_EQ(ckpt.tensors[2].tensor.numel(), 33);
  expectThrowNaming<InvalidArgument>(
      [&] { readShardedCheckpoint(path, {.split = {{"big", {40}, 0, 40}}}); }, {path, "'big'"});

  const std::string plain = dir.file("plain.st");
  writeCheckpoint(plain, {{"w", runtime::Tensor::zeros({2})}}, {{"step", "1"}});
  const Checkpoint whole = readAnyCheckpoint(plain, {.split = entries});
  ASSERT_EQ(whole.tensors.size(), 1u);
  EXPECT_EQ(whole.tensors[0].name, "w");
  EXPECT_FALSE(committedShardGeneration(plain).has_value());
  expectThrowNaming<IoError>([&] { readShardedCheckpoint(plain); }, {plain, "not a sharded checkpoint"});
}

std::vector<std::string> listing(const TempDir& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(ShardedCheckpoint, GenerationsNeverOverwriteTheCommittedOneAndAreCleanedUp) {
  TempDir dir;
  const std::string path = dir.file("run.st");
  EXPECT_EQ(nextShardGeneration(path), 1u);
  writeGeneration(path, 2, 1);
  EXPECT_EQ(nextShardGeneration(path), 2u);
  const ShardMap map = testMap(2, 0);
  expectThrowNaming<InvalidArgument>(
      [&] { writeShardFile(map, {.path = path, .generation = 1, .shards = testShards(map, 9)}); }, {path, "generation 1"});
  // A crash left generation 2 half written (one rank, with another world size too) and generation 9 begun.
  writeShardFile(map, {.path = path, .generation = 2, .shards = testShards(map, 2)});
  writeShardFile(testMap(3, 1), {.path = path, .generation = 2, .shards = testShards(testMap(3, 1), 2)});
  writeShardFile(map, {.path = path, .generation = 9, .shards = testShards(map, 9)});
  expectGeneration(readShardedCheckpoint(path), 1);
  const CommitReport report = writeGeneration(path, 3, 2);
  EXPECT_TRUE(report.cleanupErrors.empty());
  EXPECT_EQ(report.removed, 3u);  // generation 1's two and generation 2's of world size 2
  expectGeneration(readShardedCheckpoint(path), 2);
  EXPECT_EQ(listing(dir), (std::vector<std::string>{"run.st", "run.st.g2.rank0-of-3.safetensors",
                                                    "run.st.g2.rank1-of-3.safetensors", "run.st.g2.rank2-of-3.safetensors",
                                                    "run.st.g9.rank0-of-2.safetensors"}));
  expectThrowNaming<InvalidArgument>(
      [&] { commitShardedCheckpoint(testMap(3, 0), {.path = path, .generation = 2, .tensors = testTensorNames()}); },
      {path, "generation 2"});
  expectThrowNaming<InvalidArgument>(
      [&] { writeShardFile(map, {.path = path, .generation = 3, .shards = testShards(map, 3), .metadata = {{kShardFileKey, "x"}}}); },
      {kShardFileKey});
}

TEST(ShardedCheckpoint, RefusesMissingTruncatedAndCorruptShardFilesNamingThem) {
  TempDir dir;
  const std::string path = dir.file("run.st");
  writeGeneration(path, 3, 4);
  const std::string victim = shardFilePath(path, 4, 1, 3);
  const std::string good = slurp(victim);

  spit(victim, good.substr(0, good.size() - 5));
  expectThrowNaming<IoError>([&] { readShardedCheckpoint(path); }, {victim, "truncated"});
  std::string flipped = good;
  flipped[flipped.size() - 3] ^= 0x10;
  spit(victim, flipped);
  expectThrowNaming<IoError>([&] { readShardedCheckpoint(path); }, {victim, "CRC32C"});
  expectThrowNaming<IoError>([&] { readReshardedShards(path, testMap(2, 0)); }, {victim, "CRC32C"});
  ASSERT_EQ(::unlink(victim.c_str()), 0);
  expectThrowNaming<IoError>([&] { readShardedCheckpoint(path); }, {victim, "No such file"});
  expectThrowNaming<IoError>(
      [&] { commitShardedCheckpoint(testMap(3, 0), {.path = path, .generation = 5, .tensors = testTensorNames()}); },
      {shardFilePath(path, 5, 0, 3)});
  spit(victim, good);
  expectGeneration(readShardedCheckpoint(path), 4);
}

TEST(ShardedCheckpoint, RefusesATamperedManifestAndAShardFileOfAnotherMap) {
  TempDir dir;
  const std::string path = dir.file("run.st");
  writeGeneration(path, 2, 3);
  const std::string manifest = slurp(path);
  std::string tampered = manifest;
  const size_t at = tampered.find("\"generation\\\":3");  // inside the JSON string value
  ASSERT_NE(at, std::string::npos);
  tampered[at + 14] = '4';
  spit(path, tampered);
  expectThrowNaming<IoError>([&] { readShardedCheckpoint(path); }, {path});
  spit(path, manifest);

  // A rank file of another map under rank 1's name, with a manifest that vouches for its bytes.
  const std::string other = dir.file("other.st");
  const ShardMap otherMap({{"wte", 14}, {"rest", 19}}, {.worldSize = 2, .rank = 1});
  writeShardFile(otherMap, {.path = other, .generation = 3, .shards = testShards(otherMap, 3)});
  const std::string victim = shardFilePath(path, 3, 1, 2);
  std::filesystem::copy_file(shardFilePath(other, 3, 1, 2), victim, std::filesystem::copy_options::overwrite_existing);
  Checkpoint m = readCheckpoint(path);
  auto json = nlohmann::json::parse(m.metadata.at(kShardedCheckpointKey));
  const ShardFile measured = [&] {
    const std::string bytes = slurp(victim);
    return ShardFile{victim, bytes.size(), crc32c(bytes.data(), bytes.size())};
  }();
  char crc[9];
  std::snprintf(crc, sizeof crc, "%08x", measured.crc32c);
  json["files"][1]["bytes"] = measured.bytes;
  json["files"][1]["crc32c"] = crc;
  m.metadata[kShardedCheckpointKey] = json.dump();
  writeCheckpoint(path, {}, m.metadata);
  expectThrowNaming<IoError>([&] { readShardedCheckpoint(path); }, {victim, "disagree with the manifest " + path});
}

// A symbolic link another user planted at a shard file's or the manifest's path is replaced, never
// written through: the file it points to keeps its bytes.
TEST(ShardedCheckpoint, PlantedSymlinksAreReplacedNotFollowed) {
  TempDir dir;
  const std::string path = dir.file("run.st");
  const std::string target = dir.file("precious");
  spit(target, "do not touch");
  ASSERT_EQ(::symlink(target.c_str(), shardFilePath(path, 1, 0, 2).c_str()), 0);
  ASSERT_EQ(::symlink(target.c_str(), path.c_str()), 0);
  EXPECT_FALSE(committedShardGeneration(path).has_value());  // a link at P is no manifest of ours
  writeGeneration(path, 2, 1);
  EXPECT_EQ(slurp(target), "do not touch");
  EXPECT_EQ(testing::fileMode(shardFilePath(path, 1, 0, 2)), S_IFREG | 0600);
  EXPECT_EQ(testing::fileMode(path), S_IFREG | 0600);
  expectGeneration(readShardedCheckpoint(path), 1);
  // Reading does not follow one either.
  const std::string rank1 = shardFilePath(path, 1, 1, 2);
  std::filesystem::rename(rank1, dir.file("moved"));
  ASSERT_EQ(::symlink(dir.file("moved").c_str(), rank1.c_str()), 0);
  expectThrowNaming<IoError>([&] { readShardedCheckpoint(path); }, {rank1, "cannot open"});
}

}  // namespace
}  // namespace cohort::nn
