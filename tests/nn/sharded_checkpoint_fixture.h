// What the sharded checkpoint tests share: a fresh directory per test, a map whose units do not
// divide the world sizes (one smaller than every W above 1, one empty), and flat buffers whose
// values follow from (generation, tensor, element), exactly representable, so that any mix-up of
// generations, tensors, ranks or offsets shows.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "nn/sharded_checkpoint.h"
#include "runtime/error.h"

namespace cohort::nn::testing {

// A fresh directory under TEST_TMPDIR, removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(base ? base : "/tmp") + "/sharded.XXXXXX";
    if (!::mkdtemp(pattern.data())) ADD_FAILURE() << "mkdtemp " << pattern << ": " << std::strerror(errno);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// 13 + 1 + 10 + 2 + 0 + 7 = 33 elements: no unit but the empty one is a multiple of 2, 3 or 4.
inline std::vector<ShardMap::Unit> testUnits() {
  return {{"wte", 13}, {"tiny", 1}, {"h.0", 10}, {"pair", 2}, {"none", 0}, {"ln_f", 7}};
}

inline ShardMap testMap(int worldSize, int rank) { return ShardMap(testUnits(), {.worldSize = worldSize, .rank = rank}); }

inline const std::vector<std::string>& testTensorNames() {
  static const std::vector<std::string> names = {"params", "optimizer.exp_avg", "optimizer.exp_avg_sq"};
  return names;
}

// Element i of tensor t of generation g: a 24-bit integer (exact in float), different for nearly
// every (g, t, i), never 0 (the padding's value).
inline float flatValue(uint64_t generation, size_t tensor, size_t i) {
  uint64_t h = (generation * 0x9E3779B97F4A7C15ull) ^ ((tensor + 1) * 0xC2B2AE3D27D4EB4Full) ^ (i * 0x165667B19E3779F9ull);
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return static_cast<float>((h & 0xFFFFFF) | 1);
}

inline std::vector<float> flatBuffer(uint64_t generation, size_t tensor, size_t numel) {
  std::vector<float> flat(numel);
  for (size_t i = 0; i < numel; ++i) flat[i] = flatValue(generation, tensor, i);
  return flat;
}

// Rank map.rank()'s packed shards of every test tensor of `generation`.
inline std::vector<NamedTensor> testShards(const ShardMap& map, uint64_t generation) {
  std::vector<NamedTensor> shards;
  for (size_t t = 0; t < testTensorNames().size(); ++t) {
    const std::vector<float> flat = flatBuffer(generation, t, map.numel());
    runtime::Tensor shard = runtime::Tensor::zeros({static_cast<int64_t>(map.shardNumel())});
    map.pack(flat.data(), map.rank(), shard.data());
    shards.push_back({testTensorNames()[t], shard});
  }
  return shards;
}

// Every rank of world size `worldSize` writes generation `generation`, and rank 0 commits it.
inline CommitReport writeGeneration(const std::string& path, int worldSize, uint64_t generation, const Metadata& metadata = {}) {
  for (int r = 0; r < worldSize; ++r) {
    const ShardMap map = testMap(worldSize, r);
    writeShardFile(map, {.path = path, .generation = generation, .shards = testShards(map, generation), .metadata = metadata});
  }
  return commitShardedCheckpoint(testMap(worldSize, 0),
                                 {.path = path, .generation = generation, .tensors = testTensorNames(), .metadata = metadata});
}

inline bool sameFloats(const runtime::Tensor& t, const std::vector<float>& want) {
  return static_cast<size_t>(t.numel()) == want.size() &&
         (want.empty() || std::memcmp(t.data(), want.data(), want.size() * sizeof(float)) == 0);
}

// The checkpoint holds generation `generation`'s flat buffers, bit for bit, under the test names.
inline void expectGeneration(const Checkpoint& ckpt, uint64_t generation) {
  ASSERT_EQ(ckpt.tensors.size(), testTensorNames().size());
  const size_t numel = testMap(1, 0).numel();
  for (size_t t = 0; t < testTensorNames().size(); ++t) {
    EXPECT_EQ(ckpt.tensors[t].name, testTensorNames()[t]);
    EXPECT_TRUE(sameFloats(ckpt.tensors[t].tensor, flatBuffer(generation, t, numel)))
        << ckpt.tensors[t].name << " is not generation " << generation << "'s";
  }
}

// `run` throws E whose message contains every one of `needles` (a file name, the problem).
template <class E>
void expectThrowNaming(const std::function<void()>& run, const std::vector<std::string>& needles) {
  try {
    run();
    ADD_FAILURE() << "no exception; expected one naming " << needles.front();
  } catch (const E& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    for (const std::string& needle : needles) EXPECT_NE(what.find(needle), std::string::npos) << what << " lacks " << needle;
  }
}

inline mode_t fileMode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode;
}

}  // namespace cohort::nn::testing
