// The JSON a sharded checkpoint keeps in safetensors metadata, shared by nn/sharded_checkpoint.cc
// (writing, committing) and nn/sharded_checkpoint_reader.cc (reading). Internal to
// //nn:sharded_checkpoint. Decoding validates everything and throws IoError "<file>: <problem>".
//
// The manifest's kShardedCheckpointKey:
//   {"format":"cohort-sharded-v1","generation":7,"world_size":2,"units":[["wte",3200],...],
//    "tensors":["params","optimizer.exp_avg"],
//    "files":[{"name":"run.st.g7.rank0-of-2.safetensors","bytes":51280,"crc32c":"1a2b3c4d"},...]}
// A shard file's kShardFileKey: the same without "files", with "rank".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/sharded_checkpoint.h"

namespace cohort::nn::sharded_detail {

// What every shard file of a generation and its manifest agree on.
struct Layout {
  uint64_t generation = 0;
  int worldSize = 1;
  std::vector<ShardMap::Unit> units = {};
  std::vector<std::string> tensors = {};
};

std::vector<ShardMap::Unit> unitsOf(const ShardMap& map);
bool sameUnits(const std::vector<ShardMap::Unit>& a, const std::vector<ShardMap::Unit>& b);

std::string encodeManifest(const Layout& layout, const std::vector<ShardFile>& files);
// `path`: the manifest's, for messages and to place the files in its directory.
ShardedManifest decodeManifest(const std::string& path, const std::string& json);

std::string encodeShardHeader(const Layout& layout, int rank);
// The layout and rank a shard file at `path` records.
Layout decodeShardHeader(const std::string& path, const std::string& json, int* rank);

// The size and CRC32C of the regular file at `path`, opened without following a symbolic link;
// IoError naming it when it is missing, no regular file or unreadable.
ShardFile measureFile(const std::string& path);

// InvalidArgument for metadata that uses a key reserved by a checkpoint or a sharded one.
void checkCallerMetadata(const std::string& path, const Metadata& metadata);

}  // namespace cohort::nn::sharded_detail
