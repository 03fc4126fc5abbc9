#include "train/placement/placement_choice.h"

#include "collectives/communicator.h"
#include "runtime/error.h"

namespace cohort::train {

Mode parseMode(const std::string& name) {
  if (name == "local") return Mode::kLocal;
  if (name == "hogwild") return Mode::kHogwild;
  if (name == "allreduce") return Mode::kAllReduce;
  COHORT_THROW(InvalidArgument) << "unknown mode '" << name << "': expected local, hogwild or allreduce";
}

const char* toString(Mode mode) {
  switch (mode) {
    case Mode::kLocal:
      return "local";
    case Mode::kHogwild:
      return "hogwild";
    case Mode::kAllReduce:
      return "allreduce";
  }
  return "?";
}

Backend parseBackend(const std::string& name) {
  if (name.empty() || name == "auto") return Backend::kAuto;
  if (name == "shm") return Backend::kShm;
  if (name == "mpi") return Backend::kMpi;
  if (name == "hierarchical") return Backend::kHierarchical;
  if (name == "nccl") return Backend::kNccl;
  COHORT_THROW(InvalidArgument) << "unknown backend '" << name
                                << "': expected shm, mpi, hierarchical or nccl (or auto)";
}

const char* toString(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kShm:
      return "shm";
    case Backend::kMpi:
      return "mpi";
    case Backend::kHierarchical:
      return "hierarchical";
    case Backend::kNccl:
      return "nccl";
  }
  return "?";
}

const char* toString(ParamCopies copies) {
  switch (copies) {
    case ParamCopies::kAuto:
      return "auto";
    case ParamCopies::kReplicas:
      return "replicas";
    case ParamCopies::kSharedPerNode:
      return "shared per node";
  }
  return "?";
}

ZeroScope parseZeroScope(const std::string& name) {
  if (name == "job") return ZeroScope::kJob;
  if (name == "node") return ZeroScope::kNode;
  COHORT_THROW(InvalidArgument) << "unknown ZeRO scope '" << name
                                << "': expected job (shard over every rank) or node (shard within each node)";
}

const char* toString(ZeroScope scope) { return scope == ZeroScope::kNode ? "node" : "job"; }

const char* toString(PlacementKind kind) {
  switch (kind) {
    case PlacementKind::kLocal:
      return "local";
    case PlacementKind::kHogwild:
      return "hogwild";
    case PlacementKind::kReplicas:
      return "replicas";
    case PlacementKind::kSharedCopy:
      return "shared copy";
    case PlacementKind::kSharded:
      return "sharded";
  }
  return "?";
}

const char* toString(UnevenNodes uneven) {
  switch (uneven) {
    case UnevenNodes::kNotApplicable:
      return "n/a";
    case UnevenNodes::kFlatMpi:
      return "flat mpi";
    case UnevenNodes::kRefuse:
      return "refused";
  }
  return "?";
}

const char* ResolvedPlacement::backendName() const {
  return kind == PlacementKind::kLocal || kind == PlacementKind::kHogwild ? "none" : toString(backend);
}

namespace {

// ZeRO: a stage in 0..3, in mode allreduce, over replicas (the shared copy per node is one copy
// already).
void checkZero(const PlacementRequest& r) {
  if (r.zero < 0 || r.zero > kMaxZeroStage) {
    COHORT_THROW(InvalidArgument) << "ZeRO stage " << r.zero
                                  << " does not exist: 0 (full replicas), 1 (optimizer state sharded), 2 (gradients "
                                     "too) or 3 (parameters too)";
  }
  if (r.zero == 0) {
    if (r.zeroScope != ZeroScope::kJob) {
      COHORT_THROW(InvalidArgument) << "a ZeRO scope applies to ZeRO stages 1-3: give a stage too";
    }
    return;
  }
  if (r.mode != Mode::kAllReduce) {
    COHORT_THROW(InvalidArgument) << "ZeRO stage " << r.zero << " shards what mode allreduce replicates; mode "
                                  << toString(r.mode) << " has nothing to shard: use mode allreduce";
  }
  if (r.paramCopies == ParamCopies::kSharedPerNode) {
    COHORT_THROW(InvalidArgument) << "ZeRO stage " << r.zero
                                  << " shards the replicas; one shared copy per node is no replica: drop one of them";
  }
}

// The refusals that need no world: options of another mode, and the device's backends.
void checkRequest(const PlacementRequest& r, bool onGpu) {
  const std::string mode = toString(r.mode);
  if (r.backend != Backend::kAuto && r.mode != Mode::kAllReduce) {
    COHORT_THROW(InvalidArgument) << "backend '" << toString(r.backend) << "' applies to mode allreduce only, not "
                                  << mode;
  }
  if (r.paramCopies != ParamCopies::kAuto && r.mode != Mode::kAllReduce) {
    COHORT_THROW(InvalidArgument) << "replicas apply to mode allreduce only";
  }
  if (r.paramCopies == ParamCopies::kSharedPerNode && r.backend == Backend::kMpi) {
    COHORT_THROW(InvalidArgument)
        << "one shared parameter copy per node (replicas false) needs backend shm on one node "
           "or hierarchical across nodes, not mpi";
  }
  if (onGpu && r.mode == Mode::kAllReduce && r.backend != Backend::kAuto && r.backend != Backend::kNccl) {
    COHORT_THROW(InvalidArgument) << "backend " << toString(r.backend)
                                  << " all-reduces CPU memory; on a GPU use backend nccl (the default on a GPU)";
  }
  if (!onGpu && r.backend == Backend::kNccl) {
    COHORT_THROW(InvalidArgument)
        << "backend nccl all-reduces GPU memory: train on device cuda (or use shm, mpi or hierarchical)";
  }
  if (onGpu && r.paramCopies != ParamCopies::kAuto) {
    COHORT_THROW(InvalidArgument) << "replicas apply to CPU training (GPU all-reduce always replicates)";
  }
  checkZero(r);
}

// Mode allreduce on the CPU. Over mpi, and over hierarchical on one node, every rank keeps a
// replica whatever was asked (hierarchical on one node is shm inside it and nothing across).
ResolvedPlacement resolveCpuAllReduce(const PlacementRequest& r, const runtime::WorldInfo& world) {
  const std::string name = collectives::resolveBackend(
      {.backend = r.backend == Backend::kAuto ? std::string() : toString(r.backend), .world = world});
  ResolvedPlacement p{.backend = parseBackend(name)};
  const bool replicas = p.backend == Backend::kMpi || (p.backend == Backend::kHierarchical && !world.spansNodes()) ||
                        r.paramCopies == ParamCopies::kReplicas ||
                        (r.paramCopies == ParamCopies::kAuto && world.spansNodes());
  p.kind = replicas ? PlacementKind::kReplicas : PlacementKind::kSharedCopy;
  if (p.backend == Backend::kHierarchical && world.spansNodes()) {
    p.unevenNodes = r.backend == Backend::kAuto ? UnevenNodes::kFlatMpi : UnevenNodes::kRefuse;
  }
  return p;
}

// ZeRO: nccl on a GPU; on the CPU the backend as for replicas (shm on one node, hierarchical across
// nodes, flat mpi where those turn out uneven; the sharded placement splits its groups from it).
ResolvedPlacement resolveSharded(const PlacementRequest& r, const runtime::WorldInfo& world, bool onGpu) {
  ResolvedPlacement p{.kind = PlacementKind::kSharded, .zero = r.zero, .zeroScope = r.zeroScope};
  if (onGpu) {
    p.backend = Backend::kNccl;
    return p;
  }

  const std::string name = collectives::resolveBackend(
      {.backend = r.backend == Backend::kAuto ? std::string() : toString(r.backend), .world = world});
  p.backend = parseBackend(name);
  if (p.backend == Backend::kHierarchical && world.spansNodes()) {
    p.unevenNodes = r.backend == Backend::kAuto ? UnevenNodes::kFlatMpi : UnevenNodes::kRefuse;
  }
  return p;
}

}  // namespace

ResolvedPlacement resolvePlacement(const PlacementRequest& request, const runtime::WorldInfo& world, bool onGpu) {
  checkRequest(request, onGpu);
  switch (request.mode) {
    case Mode::kLocal:
      return {.kind = PlacementKind::kLocal};
    case Mode::kHogwild:
      return {.kind = PlacementKind::kHogwild};
    case Mode::kAllReduce:
      if (request.zero > 0) return resolveSharded(request, world, onGpu);
      if (onGpu) return {.kind = PlacementKind::kReplicas, .backend = Backend::kNccl};
      return resolveCpuAllReduce(request, world);
  }
  COHORT_CHECK(false) << "mode " << static_cast<int>(request.mode);
  return {};
}

}  // namespace cohort::train
