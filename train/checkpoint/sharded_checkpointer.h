// ShardedCheckpointer: the checkpoints of a sharded job (ZeRO stages >= 1, ShardedPlacement) as
// shard files and a manifest (nn/sharded_checkpoint.h), never gathered on one rank
// (docs/checkpoints.md, "Sharded checkpoints in training").
//
// The protocol, for a checkpoint at P of generation g (nn::nextShardGeneration(P), the ranks' max):
//   save     each rank that keeps a shard (ShardedPlacement::keepsShard: every rank, or with scope
//            node the first node's) packs its parameter shard and, with the optimizer's state
//            tensors (already its packed shards), writes P.g<g>.rank<r>-of-<W>.safetensors:
//            synchronously, or through an nn::AsyncShardWriter (a copy to staging, then a background
//            thread). Rank 0 keeps the manifest's part: the metadata and a copy of the model's
//            buffers (BatchNorm running statistics, identical on every rank), stored whole in the
//            manifest.
//            On a GPU the shards are device memory: a synchronous save copies them to the host
//            after the compute stream is done; an asynchronous one enqueues their copies into the
//            writer's pinned staging on the compute stream (ahead of the next step's kernels, so
//            nothing training changes later reaches the file), records an event after them, and
//            returns; the writer's thread waits for the event (bounded) before it writes.
//   settle   every rank waits for its write to be durable; ONE reduction over the job carries each
//            rank's file size and CRC32C (raw bits, rank order) and its failure: this is the
//            barrier. Rank 0 then writes the manifest (nn::commitShardedCheckpoint, the commit
//            point) and a second reduction tells every rank whether it did. A failure anywhere is an
//            IoError on every rank; the previous checkpoint stays the committed one.
// One checkpoint is in flight at most: save() settles the previous one first (waiting for it).
// settle({.wait = false}) first votes whether every write is durable and commits only then.
//
// Loading: a sharded checkpoint reshards onto this job's map (nn::readReshardedShards: every rank
// reads every shard file, keeps its own pieces), the parameters all-gathered; a whole-model
// checkpoint goes through ShardedPlacement::loadState (train/checkpoint/checkpointer.h decides).
//
// Collective: every rank calls save, settle and load at the same points, in the same order; every
// wait is bounded by the job's timeout (TimeoutError naming what was missing). Ownership: borrows
// the placement, the collectives, the parameters and the optimizer; owns the writer and its staging.
// Thread safety: the training thread only.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/async_shard_writer.h"
#include "nn/checkpoint.h"
#include "nn/optimizer.h"
#include "nn/param_buffer.h"
#include "nn/sharded_checkpoint.h"
#include "runtime/allocator.h"
#include "runtime/stream.h"
#include "runtime/world_info.h"
#include "train/checkpoint/checkpoint_options.h"
#include "train/placement/job_collectives.h"
#include "train/placement/sharded_placement.h"

namespace cohort::train {

class ShardedCheckpointer {
 public:
  struct Context {
    ShardedPlacement& placement;
    JobCollectives& collectives;
    nn::ParamBuffer& params;
    nn::Optimizer& optimizer;
    const runtime::WorldInfo& world;
    std::chrono::milliseconds timeout;
  };
  explicit ShardedCheckpointer(const Context& context);
  ~ShardedCheckpointer();
  ShardedCheckpointer(const ShardedCheckpointer&) = delete;
  ShardedCheckpointer& operator=(const ShardedCheckpointer&) = delete;

  // `metadata`: the manifest's (the caller's keys and the job's identity); the optimizer's step
  // count is added here. Synchronous: returns once committed. Async: once staged.
  void save(const std::string& path, const nn::Metadata& metadata, const SaveOptions& options);
  // Commits the checkpoint in flight (above); nullopt when none is, or (wait false) when some
  // rank's write is not durable yet.
  std::optional<CheckpointCommit> settle(const SettleOptions& options);
  bool inFlight() const { return pending_ != nullptr; }

  // Loads the sharded checkpoint at `path` (its manifest already read and validated) into this
  // rank's shards, the whole parameters and the model's buffers.
  void load(const std::string& path, const nn::ShardedManifest& manifest);

 private:
  struct Pending;
  // The generation above the committed one, the same on every rank (their max).
  uint64_t agreedGeneration(const std::string& path);
  void writeShard(Pending& pending, const SaveOptions& options);
  void stageShards(const std::vector<float*>& staging) const;
  void stageBuffers(Pending& pending);
  void recordCopied(Pending& pending) const;
  // Host memory for the staging: pinned on a GPU, else the CPU's.
  runtime::Allocator& hostAllocator() const;
  // Every rank's shard file as the manifest names them; throws on every rank when one failed.
  std::vector<nn::ShardFile> gatherFiles(const Pending& pending, const std::optional<nn::ShardFile>& file,
                                         std::exception_ptr mine);
  // Rank 0: the manifest; every rank learns whether it was written (throws if not).
  nn::CommitReport commit(const Pending& pending, const std::vector<nn::ShardFile>& files);
  // Throws on every rank when `problem` is not empty on some rank: its own message there, elsewhere
  // one naming `what` and the first such rank.
  void agreeOnFailure(std::exception_ptr problem, const std::string& what);

  ShardedPlacement& placement_;
  JobCollectives& collectives_;
  nn::ParamBuffer& params_;
  nn::Optimizer& optimizer_;
  const runtime::WorldInfo& world_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<runtime::Allocator> pinned_;  // GPU: the staging's; outlives everything below
  runtime::Tensor packed_;  // this rank's parameter shard, packed for a synchronous write
  std::vector<runtime::Tensor> bufferStaging_;  // rank 0: the model's buffers, copied at a save
  std::unique_ptr<nn::AsyncShardWriter> writer_;  // made at the first asynchronous save
  std::unique_ptr<Pending> pending_;  // the checkpoint in flight (saved, not settled)
};

}  // namespace cohort::train
