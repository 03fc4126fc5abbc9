// The choice of where a job's parameters live and what carries its collectives, made once, before
// the ranks agree on their settings, by a pure function of typed options (docs/architecture.md,
// "Choosing the strategy"):
//
//   resolvePlacement({mode, backend, paramCopies, zero, zeroScope}, world, onGpu)
//       -> {kind, backend, unevenNodes, zero, zeroScope}
//
// The options are enums, parsed from the CLI's and the settings' words by parse*/toString; the
// result is a value every rank computes alike from its own options and WorldInfo, which Job::place
// agrees on (its words are settings) and hands to the one factory (train/placement/placement_factory.h).
// Nothing rewrites it afterwards. One fact the function cannot know: whether every node runs the
// same number of workers. WorldInfo holds this node's worker count only, and a rank alone on a node
// of a 3 + 1 world cannot tell its world is uneven, so deciding it from WorldInfo would let the
// ranks choose differently. The result therefore says what happens where the nodes turn out uneven
// (UnevenNodes: flat mpi replicas, or a refusal), an agreed rule the placement applies after its
// node-size exchange; every rank applies it to the same exchanged sizes. Job::backend() then
// reports the communicator the placement got.
// Errors: InvalidArgument for a combination that cannot train (the message says what to use);
// nothing else. Plain values: copy them freely; the functions are thread-safe.
#pragma once

#include <string>

#include "runtime/world_info.h"

namespace cohort::train {

enum class Mode { kLocal, kHogwild, kAllReduce };
// "local", "hogwild", "allreduce"; InvalidArgument naming the accepted ones otherwise.
Mode parseMode(const std::string& name);
const char* toString(Mode mode);

// What carries mode allreduce's gradients and collectives. kAuto: nccl on a GPU, shm on one node,
// hierarchical across nodes (flat mpi where the nodes run different numbers of workers).
enum class Backend { kAuto, kShm, kMpi, kHierarchical, kNccl };
// "" or "auto", "shm", "mpi", "hierarchical", "nccl"; InvalidArgument otherwise.
Backend parseBackend(const std::string& name);
const char* toString(Backend backend);  // "auto" for kAuto

// Mode allreduce on the CPU: a full replica per rank with the bucketed all-reduce (kReplicas), or
// one shared copy per node that the node's ranks update in slices (kSharedPerNode: over shm, or
// hierarchical across nodes). kAuto: shared on one node; replicas across nodes, where the buckets'
// all-reduce overlaps backward and trains faster (docs/nn.md).
enum class ParamCopies { kAuto, kReplicas, kSharedPerNode };
const char* toString(ParamCopies copies);  // "auto", "replicas", "shared per node"

// Mode allreduce's sharded data parallel (ZeRO; docs/sharding.md): what each rank keeps only its
// shard of. 0: nothing (full replicas), 1: the optimizer state, 2: the gradients too, 3: the
// parameters too (PyTorch FSDP's FULL_SHARD).
inline constexpr int kMaxZeroStage = 3;
// Over which ranks a sharded job shards: every rank of the job, or the ranks of each node, each
// node's shards replicated across nodes (PyTorch's HYBRID_SHARD: the per-unit gathers stay inside
// the node).
enum class ZeroScope { kJob, kNode };
// "job", "node"; InvalidArgument otherwise.
ZeroScope parseZeroScope(const std::string& name);
const char* toString(ZeroScope scope);

// Where the parameters live (the placement the factory makes).
enum class PlacementKind {
  kLocal,       // one process, private parameters (CPU or one GPU)
  kHogwild,     // one copy per node, updated without locks (train/placement/hogwild_placement.h)
  kReplicas,    // a replica per rank, gradients all-reduced (train/placement/replica_placement.h)
  kSharedCopy,  // one copy per node, updated in slices (train/placement/shared_copy_placement.h)
  kSharded,     // ZeRO 1-3: each rank keeps its shard (train/placement/sharded_placement.h)
};
const char* toString(PlacementKind kind);

// What a placement across nodes over hierarchical does where the nodes turn out to run different
// numbers of workers (see the header comment).
enum class UnevenNodes {
  kNotApplicable,  // not hierarchical across nodes
  kFlatMpi,        // the backend was the default: replicas over flat mpi
  kRefuse,         // hierarchical was asked for: InvalidArgument on every rank
};
const char* toString(UnevenNodes uneven);

struct PlacementRequest {
  Mode mode = Mode::kLocal;
  Backend backend = Backend::kAuto;
  ParamCopies paramCopies = ParamCopies::kAuto;
  int zero = 0;  // the ZeRO stage, 0..kMaxZeroStage; above 0 mode allreduce only
  ZeroScope zeroScope = ZeroScope::kJob;
};

struct ResolvedPlacement {
  PlacementKind kind = PlacementKind::kLocal;
  Backend backend = Backend::kAuto;  // kAuto only where nothing is all-reduced (local, hogwild)
  UnevenNodes unevenNodes = UnevenNodes::kNotApplicable;
  int zero = 0;  // kSharded: the stage (1..3); 0 otherwise
  ZeroScope zeroScope = ZeroScope::kJob;  // kSharded: over which ranks

  // "none" (local, hogwild), "shm", "mpi", "hierarchical", "nccl".
  const char* backendName() const;
  // Whether every rank keeps a replica (kReplicas).
  bool replicas() const { return kind == PlacementKind::kReplicas; }
  bool operator==(const ResolvedPlacement&) const = default;
};

// The placement for `request` on `world` (onGpu: the job trains on a GPU). Pure: the same inputs
// give the same result on every rank and in every call. InvalidArgument for what cannot train (an
// option of another mode, a CPU backend on a GPU, nccl on the CPU, shm across nodes, one shared
// copy over mpi, a backend this build lacks, a ZeRO stage outside 0..3 or outside mode allreduce,
// a ZeRO stage with one shared copy per node).
ResolvedPlacement resolvePlacement(const PlacementRequest& request, const runtime::WorldInfo& world, bool onGpu);

}  // namespace cohort::train
