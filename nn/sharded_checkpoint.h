// Sharded checkpoints (ZeRO, issue 46 item 3): every rank writes its own packed shards, one rank
// commits a small manifest, and a reader assembles the whole model or reshards it for another world
// size, without the whole model ever being gathered on one rank (docs/checkpoints.md, "Sharded
// checkpoints"; PyTorch's distributed checkpoints work the same way).
//
// Files, for a checkpoint at path P (the user's own directory; every file is written as
// writeCheckpoint writes: a fresh 0600 temporary created O_EXCL|O_NOFOLLOW, fsynced, renamed over
// its target, the directory fsynced):
//   P.g<generation>.rank<r>-of-<W>.safetensors   rank r's shard file: each sharded tensor ("params",
//       "optimizer.exp_avg", ...) as map.shardNumel() floats, plus the map that cut them (metadata key
//       kShardFileKey: the generation, W, r and the units' names and real sizes) and the caller's metadata.
//   P   the manifest, written last: a safetensors file without tensors whose metadata key
//       kShardedCheckpointKey holds JSON naming the generation, W, the units, the tensor names and
//       each rank's file with its size in bytes and CRC32C; the caller's metadata beside it, and the
//       caller's whole tensors (ShardedCommit::whole: small ones every rank holds alike, such as a
//       model's BatchNorm running statistics). A file at P with that key is a sharded checkpoint; any
//       other is a whole-model one (readAnyCheckpoint).
// The commit point is the manifest's rename. A generation is written only above the committed one
// (writeShardFile refuses the others), so a new checkpoint never overwrites the files the manifest
// names: a crash at any moment leaves the last committed checkpoint whole. After the rename the
// commit removes the shard files of every older generation (committed or abandoned by a crash), the
// files of its own generation the manifest does not name, and the temporaries killed writers left;
// files of newer generations stay (a rank may already be writing the next checkpoint).
//
// Reading validates the manifest and every shard file (size and CRC32C against the manifest, the
// same map, generation and tensors in every file, every rank present) and either returns everything
// or throws IoError with one line naming the file and the problem. It reads one shard file at a
// time and copies its pieces where they belong, so it holds the result plus one rank's file: the
// whole model (readShardedCheckpoint) or only the requested rank's shards (readReshardedShards).
// Every reader of a resharded checkpoint reads all W files.
//
// Ownership: results own fresh CPU memory; writers only read the caller's tensors. Thread safety:
// the functions share no state. The protocol: every rank calls writeShardFile for generation g, the
// caller makes them all durable-and-done (a barrier), then exactly one rank calls
// commitShardedCheckpoint; nothing is collective inside.
//
//   nn::writeShardFile(map, {.path = p, .generation = g, .shards = {{"params", shard}}});
//   /* barrier */ if (rank == 0) nn::commitShardedCheckpoint(map, {.path = p, .generation = g, .tensors = {"params"}});
//   nn::Checkpoint whole = nn::readAnyCheckpoint(p, {.split = params.entries()});
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/param_buffer.h"
#include "nn/shard_map.h"

namespace cohort::nn {

// The manifest's metadata key (its presence makes P a sharded checkpoint) and a shard file's.
// Both are reserved: callers' metadata may not use them.
inline constexpr char kShardedCheckpointKey[] = "sharded_checkpoint";
inline constexpr char kShardFileKey[] = "shard_file";
inline constexpr char kShardedCheckpointFormat[] = "cohort-sharded-v1";

// Where rank `rank` of `worldSize` keeps generation `generation` of the checkpoint at `path`:
// "<path>.g<generation>.rank<rank>-of-<worldSize>.safetensors".
std::string shardFilePath(const std::string& path, uint64_t generation, int rank, int worldSize);

// A written shard file as the manifest names it.
struct ShardFile {
  std::string path = {};
  uint64_t bytes = 0;
  uint32_t crc32c = 0;  // of the whole file
};

struct ShardWrite {
  std::string path = {};                 // the checkpoint P (its manifest's path)
  uint64_t generation = 0;               // above the committed one (nextShardGeneration)
  std::vector<NamedTensor> shards = {};  // this rank's packed shards, map.shardNumel() floats each
  Metadata metadata = {};                // the caller's
};

// Writes rank map.rank()'s shard file of `write.generation` atomically and returns its size and
// CRC (read back from the file). InvalidArgument for a generation at or below the committed one
// (committedShardGeneration), a tensor of another size than map.shardNumel(), reserved metadata keys
// and whatever writeCheckpoint refuses; IoError naming the file when it cannot be written or when the
// manifest at P cannot be read.
ShardFile writeShardFile(const ShardMap& map, const ShardWrite& write);

struct ShardedCommit {
  std::string path = {};  // P
  uint64_t generation = 0;
  std::vector<std::string> tensors = {};  // the sharded tensors' names, as in every shard file
  Metadata metadata = {};                 // the caller's, e.g. the step
  // Every rank's writeShardFile result in rank order (gathered by the caller); when empty, the
  // commit reads every shard file back and validates it (the map, the generation, the tensors).
  std::vector<ShardFile> files = {};
  // With `files` given: true reads every file back and compares its size and CRC32C with them;
  // false compares the sizes only (lstat) and takes the CRCs as given, where each rank computed its
  // own from the durable file (writeShardFile does), so the commit reads no shard bytes.
  bool rereadFiles = true;
  // Tensors kept whole in the manifest itself (e.g. a model's buffers, identical on every rank): no
  // name of `tensors`, any size, on the CPU. Readers return them after the sharded tensors.
  std::vector<NamedTensor> whole = {};
};

struct CommitReport {
  size_t removed = 0;                         // files of other generations and stale temporaries
  std::vector<std::string> cleanupErrors = {};  // one line each; the commit itself succeeded
};

// Writes the manifest at `commit.path` atomically (the commit point), then cleans up (above; best
// effort: its failures are reported, never thrown). `map`: any rank's map (its units and world size
// are recorded). InvalidArgument for a generation at or below the committed one or reserved metadata
// keys; IoError naming the file for a shard file that is missing, of another size than `files` says,
// or (read back) corrupt or of another map, generation or tensors; the manifest stays as it was.
CommitReport commitShardedCheckpoint(const ShardMap& map, const ShardedCommit& commit);

// The generation the manifest at `path` commits; nullopt when there is no file at `path`, when it
// is a whole-model checkpoint, or when it is not a regular file (a symbolic link is not followed:
// the next commit replaces it). IoError naming `path` when it is corrupt.
std::optional<uint64_t> committedShardGeneration(const std::string& path);
// committedShardGeneration + 1, or 1.
uint64_t nextShardGeneration(const std::string& path);

// What a manifest says.
struct ShardedManifest {
  uint64_t generation = 0;
  int worldSize = 1;
  std::vector<ShardMap::Unit> units = {};
  std::vector<std::string> tensors = {};
  std::vector<ShardFile> files = {};  // rank order; paths in the manifest's directory
  Metadata metadata = {};             // the caller's
  std::vector<NamedTensor> whole = {};  // ShardedCommit::whole
};

// True when `ckpt` (as readCheckpoint returns it) is a sharded checkpoint's manifest.
bool isShardedManifest(const Checkpoint& ckpt);
// Reads and validates the manifest at `path` (not the shard files); IoError naming it when it is
// missing, corrupt, or not a sharded checkpoint's manifest.
ShardedManifest readShardedManifest(const std::string& path);

struct ShardedReadOptions {
  // When given (a model's ParamBuffer::entries()), the sharded tensor `splitTensor` is returned as
  // one tensor per entry, under its name and shape, as a whole-model checkpoint holds the
  // parameters; InvalidArgument naming the file when an entry lies outside it. Otherwise every
  // sharded tensor comes back as one flat buffer of the model's numel() floats.
  std::vector<ParamBuffer::Entry> split = {};
  std::string splitTensor = "params";
};

// The whole model of the sharded checkpoint at `path`: each sharded tensor assembled into its flat
// buffer (split as the options say), in the manifest's order, then the manifest's whole tensors,
// and the caller's metadata.
Checkpoint readShardedCheckpoint(const std::string& path, const ShardedReadOptions& options = {});

// A whole-model checkpoint from either kind of file: readCheckpoint's result for a whole-model
// checkpoint (the options do not apply), readShardedCheckpoint's for a sharded one.
Checkpoint readAnyCheckpoint(const std::string& path, const ShardedReadOptions& options = {});

// Resharding: rank map.rank()'s packed shard (map.shardNumel() floats, padding zero) of each
// sharded tensor of the checkpoint at `path`, in the manifest's order, for `map`, whose world size
// and units may differ from the writer's (bit for bit map.pack of the assembled flat buffer). Reads
// every shard file; holds the result and one of them, never the flat buffer. InvalidArgument naming
// the file when `map` covers another number of elements than the checkpoint.
std::vector<NamedTensor> readReshardedShards(const std::string& path, const ShardMap& map);

}  // namespace cohort::nn
