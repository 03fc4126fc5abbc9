// resolvePlacement: the placement every option and world resolve to, as a table — one node, across
// nodes (even or not: the rule for uneven nodes), GPUs, explicit backends — and the refusals, with
// the words of the enums both ways.
#include "train/placement/placement_choice.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/error.h"
#include "train/job.h"

namespace cohort::train {
namespace {

runtime::WorldInfo oneNode(int ranks) {
  return {.rank = 0, .worldSize = ranks, .localRank = 0, .localWorldSize = ranks, .jobId = "t"};
}
runtime::WorldInfo nodesOf(int perNode, int ranks) {
  return {.rank = 0, .worldSize = ranks, .localRank = 0, .localWorldSize = perNode, .jobId = "t"};
}

struct Row {
  const char* name;
  PlacementRequest request;
  runtime::WorldInfo world;
  bool onGpu;
  ResolvedPlacement expected;
};

// The table: every mode, one node and across nodes (even, and uneven as seen from a node of 3 of 4
// ranks), GPUs, defaults and explicit backends and copies.
std::vector<Row> table() {
  using B = Backend;
  using C = ParamCopies;
  using K = PlacementKind;
  using U = UnevenNodes;
  const Mode ar = Mode::kAllReduce;
  return {
      {"local", {}, oneNode(1), false, {.kind = K::kLocal}},
      {"local on a GPU", {}, oneNode(1), true, {.kind = K::kLocal}},
      {"hogwild", {.mode = Mode::kHogwild}, oneNode(4), false, {.kind = K::kHogwild}},
      {"hogwild across nodes", {.mode = Mode::kHogwild}, nodesOf(2, 4), false, {.kind = K::kHogwild}},
      {"allreduce, one node", {.mode = ar}, oneNode(4), false, {.kind = K::kSharedCopy, .backend = B::kShm}},
      {"one node, replicas",
       {.mode = ar, .paramCopies = C::kReplicas},
       oneNode(4),
       false,
       {.kind = K::kReplicas, .backend = B::kShm}},
      {"one node, mpi",
       {.mode = ar, .backend = B::kMpi},
       oneNode(2),
       false,
       {.kind = K::kReplicas, .backend = B::kMpi}},
      {"one node, hierarchical",
       {.mode = ar, .backend = B::kHierarchical, .paramCopies = C::kSharedPerNode},
       oneNode(2),
       false,
       {.kind = K::kReplicas, .backend = B::kHierarchical}},
      {"across nodes",
       {.mode = ar},
       nodesOf(2, 4),
       false,
       {.kind = K::kReplicas, .backend = B::kHierarchical, .unevenNodes = U::kFlatMpi}},
      {"across nodes, one copy per node",
       {.mode = ar, .paramCopies = C::kSharedPerNode},
       nodesOf(2, 4),
       false,
       {.kind = K::kSharedCopy, .backend = B::kHierarchical, .unevenNodes = U::kFlatMpi}},
      {"across nodes, hierarchical asked for",
       {.mode = ar, .backend = B::kHierarchical},
       nodesOf(2, 4),
       false,
       {.kind = K::kReplicas, .backend = B::kHierarchical, .unevenNodes = U::kRefuse}},
      {"across uneven nodes (3 of 4 here)",
       {.mode = ar, .paramCopies = C::kSharedPerNode},
       nodesOf(3, 4),
       false,
       {.kind = K::kSharedCopy, .backend = B::kHierarchical, .unevenNodes = U::kFlatMpi}},
      {"across nodes, mpi",
       {.mode = ar, .backend = B::kMpi},
       nodesOf(2, 4),
       false,
       {.kind = K::kReplicas, .backend = B::kMpi}},
      {"zero 1, one node",
       {.mode = ar, .zero = 1},
       oneNode(4),
       false,
       {.kind = K::kSharded, .backend = B::kShm, .zero = 1}},
      {"zero 2 with replicas asked for, mpi",
       {.mode = ar, .backend = B::kMpi, .paramCopies = C::kReplicas, .zero = 2},
       oneNode(2),
       false,
       {.kind = K::kSharded, .backend = B::kMpi, .zero = 2}},
      {"zero 1 across nodes, scope node",
       {.mode = ar, .zero = 1, .zeroScope = ZeroScope::kNode},
       nodesOf(2, 4),
       false,
       {.kind = K::kSharded,
        .backend = B::kHierarchical,
        .unevenNodes = U::kFlatMpi,
        .zero = 1,
        .zeroScope = ZeroScope::kNode}},
      {"GPUs", {.mode = ar}, oneNode(2), true, {.kind = K::kReplicas, .backend = B::kNccl}},
      {"zero 3 on GPUs", {.mode = ar, .zero = 3}, nodesOf(2, 4), true, {.kind = K::kSharded, .backend = B::kNccl, .zero = 3}},
      {"zero 2 on GPUs across nodes, scope node",
       {.mode = ar, .zero = 2, .zeroScope = ZeroScope::kNode},
       nodesOf(2, 4),
       true,
       {.kind = K::kSharded, .backend = B::kNccl, .zero = 2, .zeroScope = ZeroScope::kNode}},
      {"GPUs, nccl asked for",
       {.mode = ar, .backend = B::kNccl},
       nodesOf(2, 4),
       true,
       {.kind = K::kReplicas, .backend = B::kNccl}},
  };
}

TEST(ResolvePlacement, EveryOptionAndWorldResolvesToOnePlacement) {
  for (const Row& row : table()) {
    const ResolvedPlacement got = resolvePlacement(row.request, row.world, row.onGpu);
    EXPECT_EQ(got, row.expected) << row.name << ": got " << toString(got.kind) << " over " << got.backendName()
                                 << ", uneven nodes " << toString(got.unevenNodes);
    EXPECT_EQ(resolvePlacement(row.request, row.world, row.onGpu), got)
        << row.name << ": the same inputs, the same result";
  }
}

TEST(ResolvePlacement, WhatCannotTrainIsRefused) {
  const Mode ar = Mode::kAllReduce;
  const struct {
    const char* name;
    PlacementRequest request;
    runtime::WorldInfo world;
    bool onGpu;
    const char* says;
  } refusals[] = {
      {"a backend in mode local", {.backend = Backend::kShm}, oneNode(1), false, "applies to mode allreduce only"},
      {"copies in mode hogwild",
       {.mode = Mode::kHogwild, .paramCopies = ParamCopies::kReplicas},
       oneNode(2),
       false,
       "replicas apply to mode allreduce only"},
      {"one copy per node over mpi",
       {.mode = ar, .backend = Backend::kMpi, .paramCopies = ParamCopies::kSharedPerNode},
       oneNode(2),
       false,
       "not mpi"},
      {"shm on a GPU", {.mode = ar, .backend = Backend::kShm}, oneNode(2), true, "use backend nccl"},
      {"nccl on the CPU", {.mode = ar, .backend = Backend::kNccl}, oneNode(2), false, "train on device cuda"},
      {"copies on a GPU", {.mode = ar, .paramCopies = ParamCopies::kReplicas}, oneNode(2), true, "CPU training"},
      {"shm across nodes", {.mode = ar, .backend = Backend::kShm}, nodesOf(2, 4), false, "works on one node"},
      {"zero in mode local", {.zero = 1}, oneNode(1), false, "mode local has nothing to shard"},
      {"zero in mode hogwild", {.mode = Mode::kHogwild, .zero = 2}, oneNode(2), false, "use mode allreduce"},
      {"zero 4", {.mode = ar, .zero = 4}, oneNode(2), false, "ZeRO stage 4 does not exist"},
      {"zero -1", {.mode = ar, .zero = -1}, oneNode(2), false, "does not exist"},
      {"zero with one copy per node",
       {.mode = ar, .paramCopies = ParamCopies::kSharedPerNode, .zero = 1},
       oneNode(2),
       false,
       "drop one of them"},
      {"a scope without a stage", {.mode = ar, .zeroScope = ZeroScope::kNode}, oneNode(2), false, "give a stage"},
  };
  for (const auto& r : refusals) {
    try {
      resolvePlacement(r.request, r.world, r.onGpu);
      ADD_FAILURE() << r.name << ": not refused";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(r.says), std::string::npos) << r.name << ": " << e.what();
    }
  }
}

TEST(ResolvePlacement, JobOptionsResolveThroughTheSameFunction) {
  const JobOptions options{.mode = Mode::kAllReduce, .paramCopies = ParamCopies::kReplicas};
  EXPECT_EQ(resolvePlacement(options, oneNode(2)),
            resolvePlacement({.mode = Mode::kAllReduce, .paramCopies = ParamCopies::kReplicas}, oneNode(2), false));
}

TEST(ResolvePlacement, TheWordsOfTheEnumsReadBack) {
  for (Backend b : {Backend::kAuto, Backend::kShm, Backend::kMpi, Backend::kHierarchical, Backend::kNccl}) {
    EXPECT_EQ(parseBackend(toString(b)), b);
  }
  EXPECT_EQ(parseBackend(""), Backend::kAuto);
  EXPECT_THROW(parseBackend("gloo"), InvalidArgument);
  for (Mode m : {Mode::kLocal, Mode::kHogwild, Mode::kAllReduce}) EXPECT_EQ(parseMode(toString(m)), m);
  for (ZeroScope z : {ZeroScope::kJob, ZeroScope::kNode}) EXPECT_EQ(parseZeroScope(toString(z)), z);
  EXPECT_THROW(parseZeroScope("rack"), InvalidArgument);
  EXPECT_STREQ(ResolvedPlacement{}.backendName(), "none");
  EXPECT_STREQ((ResolvedPlacement{.kind = PlacementKind::kReplicas, .backend = Backend::kMpi}.backendName()), "mpi");
}

}  // namespace
}  // namespace cohort::train
