// Writing and committing sharded checkpoints; reading them is nn/sharded_checkpoint_reader.cc.
#include "nn/sharded_checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>

#include "nn/sharded_checkpoint_format.h"
#include "runtime/error.h"
#include "runtime/output_file.h"
#include "runtime/unique_fd.h"

namespace cohort::nn {

using namespace sharded_detail;

namespace {

// The generation, rank and world size a shard file's name gives, for `base`, the checkpoint's file
// name; false for any other name.
struct ShardName {
  uint64_t generation = 0;
  int rank = 0;
  int worldSize = 0;
};
bool parseShardName(const std::string& base, const std::string& name, ShardName* out) {
  if (name.compare(0, base.size(), base) != 0) return false;
  const std::string rest = name.substr(base.size());
  int used = 0;
  if (std::sscanf(rest.c_str(), ".g%" SCNu64 ".rank%d-of-%d.safetensors%n", &out->generation, &out->rank,
                  &out->worldSize, &used) != 3) {
    return false;
  }
  // Only the names shardFilePath makes (no signs, leading zeros or trailing bytes).
  return static_cast<size_t>(used) == rest.size() &&
         runtime::splitOutputPath(shardFilePath(base, out->generation, out->rank, out->worldSize)).second == name;
}

void refuseStaleGeneration(const std::string& path, uint64_t generation) {
  const std::optional<uint64_t> committed = committedShardGeneration(path);
  if (committed && generation <= *committed) {
    COHORT_THROW(InvalidArgument) << path << ": generation " << generation << " is not above the committed generation "
                                  << *committed << ": its shard files are the checkpoint a resume loads";
  }
}

// The file at `path` with the CRC `given` reports, its size from lstat (no symbolic link, a regular
// file): ShardedCommit::rereadFiles false.
ShardFile statFile(const std::string& path, const ShardFile& given) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) COHORT_THROW(IoError) << path << ": missing shard file: " << std::strerror(errno);
  if (!S_ISREG(st.st_mode)) COHORT_THROW(IoError) << path << ": is not a regular file";
  return {.path = path, .bytes = static_cast<uint64_t>(st.st_size), .crc32c = given.crc32c};
}

// The files `commit` names, each checked: given by the caller (size checked here) or read back
// and validated against the map, the generation and the tensors.
std::vector<ShardFile> checkedFiles(const ShardMap& map, const ShardedCommit& commit, const Layout& layout) {
  const int w = map.worldSize();
  if (!commit.files.empty() && commit.files.size() != static_cast<size_t>(w)) {
    COHORT_THROW(InvalidArgument) << commit.path << ": " << commit.files.size() << " shard files for world size " << w;
  }
  std::vector<ShardFile> files;
  for (int r = 0; r < w; ++r) {
    const std::string expected = shardFilePath(commit.path, commit.generation, r, w);
    ShardFile measured = !commit.files.empty() && !commit.rereadFiles ? statFile(expected, commit.files[static_cast<size_t>(r)])
                                                                       : measureFile(expected);
    if (!commit.files.empty()) {
      const ShardFile& given = commit.files[static_cast<size_t>(r)];
      if (given.path != expected) COHORT_THROW(InvalidArgument) << given.path << ": is not rank " << r << "'s shard file, " << expected;
      if (given.bytes != measured.bytes || given.crc32c != measured.crc32c) {
        COHORT_THROW(IoError) << expected << ": " << measured.bytes << " bytes on disk, " << given.bytes
                              << " when written: it changed since";
      }
    } else {
      const Checkpoint shard = readCheckpoint(expected);
      int rank = -1;
      const auto record = shard.metadata.find(kShardFileKey);
      if (record == shard.metadata.end()) COHORT_THROW(IoError) << expected << ": not a shard file (no " << kShardFileKey << ")";
      const Layout got = decodeShardHeader(expected, record->second, &rank);
      if (rank != r || got.generation != layout.generation || got.worldSize != w || !sameUnits(got.units, layout.units) ||
          got.tensors != layout.tensors) {
        COHORT_THROW(IoError) << expected << ": records another rank, generation, map or tensors than this commit";
      }
    }
    files.push_back(std::move(measured));
  }
  return files;
}

// Removes the shard files of generations below `generation`, those of `generation` that `keep`
// does not name, and stale temporaries of any generation (above).
CommitReport removeOtherGenerations(const std::string& path, uint64_t generation, const std::vector<ShardFile>& keep) {
  CommitReport report;
  const auto [dir, base] = runtime::splitOutputPath(path);
  std::set<std::string> kept;
  for (const ShardFile& f : keep) kept.insert(runtime::splitOutputPath(f.path).second);
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) {
    report.cleanupErrors.push_back(dir + ": cannot list old shard files: " + std::strerror(errno));
    return report;
  }
  std::set<std::string> temporariesOf;
  std::vector<std::string> doomed;
  while (const dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    ShardName parsed;
    const size_t tmp = name.rfind(".tmp.");
    if (name[0] == '.' && tmp != std::string::npos && parseShardName(base, name.substr(1, tmp - 1), &parsed)) {
      temporariesOf.insert(dir + "/" + name.substr(1, tmp - 1));
    } else if (parseShardName(base, name, &parsed) &&
               (parsed.generation < generation || (parsed.generation == generation && !kept.count(name)))) {
      doomed.push_back(name);
    }
  }
  const int dirFd = ::dirfd(d.get());
  for (const std::string& name : doomed) {
    if (::unlinkat(dirFd, name.c_str(), 0) == 0) {
      ++report.removed;
    } else if (errno != ENOENT) {
      report.cleanupErrors.push_back(dir + "/" + name + ": cannot remove old shard file: " + std::strerror(errno));
    }
  }
  for (const std::string& target : temporariesOf) report.removed += runtime::removeStaleTemporaries(target);
  return report;
}

}  // namespace

std::string shardFilePath(const std::string& path, uint64_t generation, int rank, int worldSize) {
  return path + ".g" + std::to_string(generation) + ".rank" + std::to_string(rank) + "-of-" +
         std::to_string(worldSize) + ".safetensors";
}

std::optional<uint64_t> committedShardGeneration(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;
    COHORT_THROW(IoError) << path << ": cannot stat the checkpoint: " << std::strerror(errno);
  }
  if (!S_ISREG(st.st_mode)) return std::nullopt;
  const Checkpoint manifest = readCheckpoint(path);
  if (!isShardedManifest(manifest)) return std::nullopt;
  return decodeManifest(path, manifest.metadata.at(kShardedCheckpointKey)).generation;
}

uint64_t nextShardGeneration(const std::string& path) {
  const std::optional<uint64_t> committed = committedShardGeneration(path);
  return committed ? *committed + 1 : 1;
}

ShardFile writeShardFile(const ShardMap& map, const ShardWrite& write) {
  const std::string file = shardFilePath(write.path, write.generation, map.rank(), map.worldSize());
  checkCallerMetadata(file, write.metadata);
  Layout layout{.generation = write.generation, .worldSize = map.worldSize(), .units = unitsOf(map)};
  std::vector<NamedTensor> shards;
  for (const NamedTensor& t : write.shards) {
    if (!t.tensor.defined() || static_cast<size_t>(t.tensor.numel()) != map.shardNumel()) {
      COHORT_THROW(InvalidArgument) << file << ": shard '" << t.name << "' has " << (t.tensor.defined() ? t.tensor.numel() : 0)
                                    << " elements, the map's shards " << map.shardNumel();
    }
    layout.tensors.push_back(t.name);
    shards.push_back({t.name, t.tensor.reshape({static_cast<int64_t>(map.shardNumel())})});
  }
  refuseStaleGeneration(write.path, write.generation);
  Metadata metadata = write.metadata;
  metadata[kShardFileKey] = encodeShardHeader(layout, map.rank());
  writeCheckpoint(file, shards, metadata);
  return measureFile(file);
}

CommitReport commitShardedCheckpoint(const ShardMap& map, const ShardedCommit& commit) {
  checkCallerMetadata(commit.path, commit.metadata);
  refuseStaleGeneration(commit.path, commit.generation);
  const Layout layout{.generation = commit.generation,
                      .worldSize = map.worldSize(),
                      .units = unitsOf(map),
                      .tensors = commit.tensors};
  for (const NamedTensor& t : commit.whole) {
    if (std::find(commit.tensors.begin(), commit.tensors.end(), t.name) != commit.tensors.end()) {
      COHORT_THROW(InvalidArgument) << commit.path << ": '" << t.name << "' is both sharded and whole";
    }
  }
  const std::vector<ShardFile> files = checkedFiles(map, commit, layout);
  Metadata metadata = commit.metadata;
  metadata[kShardedCheckpointKey] = encodeManifest(layout, files);
  writeCheckpoint(commit.path, commit.whole, metadata);  // the commit point
  return removeOtherGenerations(commit.path, commit.generation, files);
}

}  // namespace cohort::nn
