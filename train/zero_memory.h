// What one rank of a ZeRO job holds of the model's training state, estimated from the model's units
// before anything is allocated (docs/sharding.md, "Memory per rank"): the figures `cohort train`'s
// --memory-report and memory floor count (cli/memory_estimate.h) and that `cohort bench memory`
// prints beside Job::stateBytes(), which measures the same kinds from the placement's buffers.
//
// ZeRO's Figure 1 for Cohort's fp32 state, N parameters, W ranks in the shard group and s floats of
// optimizer state per parameter (AdamW and Adam 2, SGD with momentum 1, plain SGD 0):
//   stage 0   params 4N    grads 4N    optimizer 4sN
//   stage 1   params 4N    grads 4N    optimizer 4sN/W
//   stage 2   params 4N    grads 4N/W  optimizer 4sN/W
//   stage 3   params 4N/W  grads 4N/W  optimizer 4sN/W
// where N/W is exact: the shard a rank packs, Σ over the units of ceil(n/W) (nn/shard_map.h), so a
// unit W does not divide counts its padding. Beside them, in `staging`, the temporary buffers
// Cohort's sharded placement needs (each of a padded unit's size, ceil(n/W)·W floats):
//   stages 1, 2  every padded unit's staging (a unit of n elements that W does not divide goes
//                through it for its reduce-scatter and its parameters' all-gather);
//   stage 2      gradient windows for the units in flight: the kGradientWindows largest units;
//   stage 3      parameter windows for kParameterWindows units (the one computed with and the one
//                prefetched) and the gradient windows as stage 2; no padded units' staging (the
//                windows are padded already).
// Precision: --precision bf16 keeps fp32 master weights, gradients and optimizer state (docs/gpu.md,
// "Precision"), so its model states are fp32's. Its gathers send the parameters the passes read as
// bf16 in bf16 (train/placement/gather_plan.h): given gatherWords (bf16GatherWords: each unit's
// words per rank, 0 for a unit gathered in fp32), `staging` counts the message buffers of the units
// with the largest messages (W·words 16-bit words each, rounded up to whole floats): at stage 1
// kMessagesInFlight (the gathers after a step); at stage 2 as many, less the gradient windows they
// reuse (the pool has them back by then), and no padded-unit staging for the units sent as
// messages (they need none); at stage 3 one (the prefetched unit's, held while backward holds the
// gradient windows; a model's implicit units, gathered after each step, may hold kMessagesInFlight). Without gatherWords the
// figures are fp32's. (The wire table, 24 bytes per segment of at most 4096 elements, is not
// counted: well under 1% of the units' bytes.)
// Pure arithmetic; thread-safe.
//
//   train::StateBytes b = train::zeroStateBytes({.units = sizes, .stage = 2, .groupSize = 4,
//                                                .optimizer = {.kind = nn::OptimizerKind::kAdamW}});
//   b.params + b.grads + b.optimizer;  // the model states; b.staging: the temporary buffers
#pragma once

#include <cstddef>
#include <vector>

#include "nn/optimizer.h"
#include "nn/param_buffer.h"
#include "runtime/dtype.h"
#include "runtime/world_info.h"
#include "train/placement/placement_choice.h"
#include "train/state_bytes.h"

namespace cohort::train {

inline constexpr size_t kGradientWindows = 3;   // stages 2 and 3: gradient units in flight
inline constexpr size_t kParameterWindows = 2;  // stage 3: the unit computed with and the prefetched one

struct ZeroMemoryOptions {
  std::vector<size_t> units;  // the model's units' sizes in elements, in order; they sum to N
  int stage = 0;              // 0..3
  int groupSize = 1;          // W: the shard group's ranks (shardGroupSize)
  nn::OptimizerOptions optimizer = {};
  runtime::DType precision = runtime::DType::kF32;
  // bf16: per unit (as `units`), the 16-bit words each rank sends in its gathers (bf16GatherWords
  // for this group size); empty: every unit gathered in fp32.
  std::vector<size_t> gatherWords = {};
  bool onGpu = false;  // where the placement's peak differs (zeroPlacementPeakBytes)
};

// The figures above. InvalidArgument for a stage outside 0..3, a group size below 1, or gatherWords
// of another length than units.
StateBytes zeroStateBytes(const ZeroMemoryOptions& options);

// Per unit of `params` (its units() order), the 16-bit words each of `groupSize` ranks sends in the
// gathers of a bf16 run (GatherPlan::words; 0: the unit goes in fp32): ZeroMemoryOptions::gatherWords.
std::vector<size_t> bf16GatherWords(const nn::ParamBuffer& params, int groupSize);

// The most a rank holds while Job::place places the model, before the first step, with the optimizer
// made by Job::makeOptimizer (already the shard's): stage 0 its steady state; stages 1 and 2 the whole
// parameters Job::place bound and their copy in the communicator's memory, beside the optimizer's
// shard (4N + 4N + 4sN/W); stage 3 the whole parameters the initialisation fills, the packed
// parameter shard and the optimizer's (4N + 4N/W + 4sN/W). On a GPU (onGpu; device memory) the
// whole parameters and gradients are moved to the device before the shards are made from them:
// stage 1 4N + 4N + 4sN/W, stage 2 that and the gradient shard 4N/W, stage 3 that and both shards
// 8N/W. An optimizer made for the whole model adds its whole state until the placement shards it.
size_t zeroPlacementPeakBytes(const ZeroMemoryOptions& options);

// The floats of state the optimizer keeps per parameter: 2 for Adam and AdamW, 1 for SGD with
// momentum, 0 for plain SGD.
size_t optimizerStateFloats(const nn::OptimizerOptions& optimizer);

// W: the job's ranks with scope job, this node's with scope node.
int shardGroupSize(const runtime::WorldInfo& world, ZeroScope scope);

}  // namespace cohort::train
