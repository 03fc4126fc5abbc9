// Reading sharded checkpoints: the manifest, each shard file checked against it, and the pieces
// copied where the reader wants them (the whole model, or another map's shard).
#include <algorithm>
#include <cstring>

#include "nn/sharded_checkpoint.h"
#include "nn/sharded_checkpoint_format.h"
#include "runtime/error.h"

namespace cohort::nn {

using namespace sharded_detail;

namespace {

ShardedManifest manifestOf(const std::string& path, const Checkpoint& ckpt) {
  const auto record = ckpt.metadata.find(kShardedCheckpointKey);
  if (record == ckpt.metadata.end()) {
    COHORT_THROW(IoError) << path << ": not a sharded checkpoint (no '" << kShardedCheckpointKey << "' in its metadata)";
  }
  ShardedManifest manifest = decodeManifest(path, record->second);
  for (const NamedTensor& t : ckpt.tensors) {
    if (std::find(manifest.tensors.begin(), manifest.tensors.end(), t.name) != manifest.tensors.end()) {
      COHORT_THROW(IoError) << path << ": the manifest holds '" << t.name << "' whole, and its shard files sharded";
    }
  }
  manifest.whole = ckpt.tensors;
  manifest.metadata = ckpt.metadata;
  manifest.metadata.erase(kShardedCheckpointKey);
  return manifest;
}

// Rank `rank`'s shard file, checked against the manifest at `path`.
Checkpoint readShardFile(const std::string& path, const ShardedManifest& manifest, int rank) {
  const ShardFile& want = manifest.files.at(static_cast<size_t>(rank));
  const ShardFile got = measureFile(want.path);
  if (got.bytes != want.bytes) {
    COHORT_THROW(IoError) << want.path << ": " << got.bytes << " bytes, but the manifest " << path << " says "
                          << want.bytes << " (truncated or replaced)";
  }
  if (got.crc32c != want.crc32c) {
    COHORT_THROW(IoError) << want.path << ": CRC32C " << std::hex << got.crc32c << ", but the manifest " << path
                          << " says " << want.crc32c << " (corrupt or replaced)";
  }
  Checkpoint shard = readCheckpoint(want.path);
  const auto record = shard.metadata.find(kShardFileKey);
  if (record == shard.metadata.end()) COHORT_THROW(IoError) << want.path << ": not a shard file (no '" << kShardFileKey << "')";
  int recordedRank = -1;
  const Layout layout = decodeShardHeader(want.path, record->second, &recordedRank);
  if (recordedRank != rank || layout.generation != manifest.generation || layout.worldSize != manifest.worldSize ||
      !sameUnits(layout.units, manifest.units) || layout.tensors != manifest.tensors) {
    COHORT_THROW(IoError) << want.path << ": records rank " << recordedRank << " of " << layout.worldSize << ", generation "
                          << layout.generation << " and its own units and tensors, which disagree with the manifest "
                          << path;
  }
  const size_t shardNumel = ShardMap(manifest.units, {.worldSize = manifest.worldSize, .rank = rank}).shardNumel();
  for (size_t i = 0; i < manifest.tensors.size(); ++i) {
    const NamedTensor& t = shard.tensors.at(i);
    if (t.name != manifest.tensors[i] || static_cast<size_t>(t.tensor.numel()) != shardNumel) {
      COHORT_THROW(IoError) << want.path << ": tensor '" << t.name << "' of " << t.tensor.numel()
                            << " elements where the manifest has '" << manifest.tensors[i] << "' of " << shardNumel;
    }
  }
  return shard;
}

std::vector<ShardMap::Piece> realPieces(const ShardMap& map, int rank) {
  std::vector<ShardMap::Piece> pieces = map.pieces(rank);
  std::erase_if(pieces, [](const ShardMap::Piece& p) { return p.realNumel() == 0; });
  return pieces;
}

// Copies the real elements that rank `from` of `source` holds in `src` into rank target.rank()'s
// packed shard `dst` wherever the two ranks' pieces overlap in the flat buffer. Both lists of real
// pieces are disjoint and ascending in the flat buffer, so one merge pass finds every overlap.
void copyOverlap(const ShardMap& source, int from, const float* src, const ShardMap& target, float* dst) {
  const std::vector<ShardMap::Piece> a = realPieces(source, from);
  const std::vector<ShardMap::Piece> b = realPieces(target, target.rank());
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const size_t lo = std::max(a[i].flatBegin, b[j].flatBegin);
    const size_t hi = std::min(a[i].flatEnd, b[j].flatEnd);
    if (lo < hi) {
      std::memcpy(dst + b[j].shardOffset + (lo - b[j].flatBegin), src + a[i].shardOffset + (lo - a[i].flatBegin),
                  (hi - lo) * sizeof(float));
    }
    if (a[i].flatEnd <= b[j].flatEnd) {
      ++i;
    } else {
      ++j;
    }
  }
}

// Every sharded tensor as `target`'s shard for its rank, read one shard file at a time.
std::vector<NamedTensor> reshard(const std::string& path, const ShardedManifest& manifest, const ShardMap& target) {
  const ShardMap source(manifest.units, {.worldSize = manifest.worldSize, .rank = 0});
  if (source.numel() != target.numel()) {
    COHORT_THROW(InvalidArgument) << path << ": the checkpoint holds " << source.numel() << " elements per tensor, the map "
                                  << target.numel();
  }
  std::vector<NamedTensor> out;
  for (const std::string& name : manifest.tensors) {
    out.push_back({name, runtime::Tensor::zeros({static_cast<int64_t>(target.shardNumel())})});
  }
  for (int r = 0; r < manifest.worldSize; ++r) {
    const Checkpoint shard = readShardFile(path, manifest, r);
    for (size_t i = 0; i < out.size(); ++i) {
      copyOverlap(source, r, shard.tensors[i].tensor.data(), target, out[i].tensor.data());
    }
  }
  return out;
}

// `flat` cut into the parameters `entries` name.
void appendSplit(const std::string& path, const runtime::Tensor& flat, const std::vector<ParamBuffer::Entry>& entries,
                 std::vector<NamedTensor>& out) {
  for (const ParamBuffer::Entry& e : entries) {
    if (e.offset + e.numel > static_cast<size_t>(flat.numel()) || static_cast<size_t>(e.shape.numel()) != e.numel) {
      COHORT_THROW(InvalidArgument) << path << ": parameter '" << e.name << "' (elements " << e.offset << ".."
                                    << e.offset + e.numel << ") lies outside the checkpoint's " << flat.numel();
    }
    runtime::Tensor t = runtime::Tensor::empty(e.shape, runtime::cpuAllocator());
    if (e.numel > 0) std::memcpy(t.data(), flat.data() + e.offset, e.numel * sizeof(float));
    out.push_back({e.name, std::move(t)});
  }
}

Checkpoint assemble(const std::string& path, ShardedManifest manifest, const ShardedReadOptions& options) {
  const bool splits = !options.split.empty();
  if (splits && std::find(manifest.tensors.begin(), manifest.tensors.end(), options.splitTensor) == manifest.tensors.end()) {
    COHORT_THROW(InvalidArgument) << path << ": no sharded tensor '" << options.splitTensor << "' to split into parameters";
  }
  size_t numel = 0;
  for (const ShardMap::Unit& u : manifest.units) numel += u.numel;
  const ShardMap whole({{"flat", numel}}, {.worldSize = 1, .rank = 0});  // its one shard is the flat buffer
  Checkpoint ckpt{.metadata = std::move(manifest.metadata)};
  for (NamedTensor& t : reshard(path, manifest, whole)) {
    if (splits && t.name == options.splitTensor) {
      appendSplit(path, t.tensor, options.split, ckpt.tensors);
    } else {
      ckpt.tensors.push_back(std::move(t));
    }
  }
  for (NamedTensor& t : manifest.whole) ckpt.tensors.push_back(std::move(t));
  return ckpt;
}

}  // namespace

bool isShardedManifest(const Checkpoint& ckpt) { return ckpt.metadata.count(kShardedCheckpointKey) > 0; }

ShardedManifest readShardedManifest(const std::string& path) { return manifestOf(path, readCheckpoint(path)); }

Checkpoint readShardedCheckpoint(const std::string& path, const ShardedReadOptions& options) {
  return assemble(path, readShardedManifest(path), options);
}

Checkpoint readAnyCheckpoint(const std::string& path, const ShardedReadOptions& options) {
  Checkpoint ckpt = readCheckpoint(path);
  if (!isShardedManifest(ckpt)) return ckpt;
  return assemble(path, manifestOf(path, ckpt), options);
}

std::vector<NamedTensor> readReshardedShards(const std::string& path, const ShardMap& map) {
  return reshard(path, readShardedManifest(path), map);
}

}  // namespace cohort::nn
