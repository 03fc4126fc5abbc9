// Checkpointer: a job's state <-> checkpoint files (the safetensors format of nn/checkpoint.h).
//
// A checkpoint holds every parameter under its own name ("fc0.weight"), every model buffer under its
// own ("bn0.running_mean"), the optimizer state as the placement stores it ("optimizer.<state>", or
// "optimizer.rank<k>.<state>" per Hogwild worker), and metadata: what must match to resume (model
// name, optimizer, parameter count), what the job was (world size, mode) and whatever the caller
// adds (a Trainer's epoch, samples seen, step, Rng state...). It asks the placement what to save and
// lets it load what this rank holds, so one format serves every mode.
//
// A checkpoint loads on any number of ranks (an elastic resume, docs/checkpoints.md): the state of
// a lockstep job (local, allreduce) is one for the job whatever its size; Hogwild's per-worker
// states are merged or split by HogwildPlacement. Between Hogwild and the lockstep modes it is
// refused. A caller that needs the same world size passes {"world_size", N} in `mustMatch`.
//
// save() and load() are collective: every rank calls them at the same point. Rank 0 writes
// (atomically: temporary file, fsync, rename); where ranks share the parameters, the others wait
// until it has written them. A sharded job (ZeRO, Context::sharded) writes a sharded checkpoint
// instead: each rank its shard file, rank 0 the manifest that commits them, synchronously or in the
// background (SaveOptions::async; settle() commits; train/checkpoint/sharded_checkpointer.h).
// load() takes either kind of file in any job: a sharded checkpoint is resharded onto a sharded
// job's map, or assembled whole (nn::readAnyCheckpoint) for any other job; a whole-model one loads
// as always. Both kinds are validated alike before any state changes (a sharded checkpoint's
// parameters by the names and shapes its manifest records, "param_shapes"). load() validates everything that must match before it changes any
// state, and throws InvalidArgument naming the first difference (another model, optimizer, Hogwild
// against a lockstep mode, parameter shape, or a caller's `mustMatch` value), IoError for a corrupt
// file.
// Ownership: borrows the placement, the job's collectives, the model and the optimizer. Thread safety: the training
// thread only.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "nn/checkpoint.h"
#include "nn/model.h"
#include "nn/optimizer.h"
#include "runtime/world_info.h"
#include "train/checkpoint/checkpoint_options.h"
#include "train/placement/job_collectives.h"
#include "train/placement/placement.h"

namespace cohort::train {

// A metadata value of the checkpoint at `path`: IoError naming the key when it is missing (or, for
// metadataCount, not a non-negative integer).
const std::string& metadataText(const nn::Metadata& metadata, const std::string& key, const std::string& path);
int64_t metadataCount(const nn::Metadata& metadata, const std::string& key, const std::string& path);

class ShardedCheckpointer;
class ShardedPlacement;

class Checkpointer {
 public:
  struct Context {
    Placement& placement;
    JobCollectives& collectives;
    nn::Model& model;
    nn::Optimizer& optimizer;
    const runtime::WorldInfo& world;
    runtime::cuda::GpuContext* gpu = nullptr;
    std::string mode;  // "local", "hogwild", "allreduce": written, and compared on load
    ShardedPlacement* sharded = nullptr;  // the placement, where it is ZeRO's: sharded checkpoints
    std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // the job's
  };
  explicit Checkpointer(const Context& context);
  ~Checkpointer();

  // `extra` may not use the keys the checkpointer writes itself (InvalidArgument); options.async
  // only where the job is sharded (InvalidArgument otherwise).
  void save(const std::string& path, const nn::Metadata& extra, const SaveOptions& options = {});
  // Commits the sharded checkpoint in flight (nullopt: none, or not durable yet with wait false).
  std::optional<CheckpointCommit> settle(const SettleOptions& options);
  bool inFlight() const;
  // nullopt when there is no file at `path` (on every rank alike: a path every rank sees).
  std::optional<nn::Metadata> load(const std::string& path, const nn::Metadata& mustMatch);

 private:
  nn::Metadata identity() const;
  // `shapes`: each parameter's shape as Shape::str() writes it, by name, as the checkpoint has them.
  void validate(const nn::Metadata& metadata, const std::map<std::string, std::string>& shapes, const std::string& path,
                const nn::Metadata& mustMatch) const;
  void loadWhole(const nn::Checkpoint& checkpoint, const std::string& path);

  Placement& placement_;
  JobCollectives& collectives_;
  nn::Model& model_;
  nn::Optimizer& optimizer_;
  const runtime::WorldInfo& world_;
  runtime::cuda::GpuContext* gpu_;
  std::string mode_;
  std::unique_ptr<ShardedCheckpointer> sharded_;  // where the placement is ZeRO's
};

}  // namespace cohort::train
