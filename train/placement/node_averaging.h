// NodeAveraging: the part of Hogwild that crosses nodes (mode hogwild on a world that spans nodes;
// docs/cluster.md, "Hogwild across nodes"). Inside each node the workers update the node's one
// shared copy of the parameters without locks (HogwildPlacement); this keeps the nodes' copies
// together by averaging them over MPI.
//
// The averaging rule. Each node's leader (local rank 0) counts its own optimizer steps since the
// last full average. Every `every` of them it starts a round: it snapshots the node's copy, starts
// an all-reduce (kAvg) of a copy of the snapshot with the other leaders (an MPI communicator of the
// leaders, makeMpiCommunicator(options, color 0)) and goes on training. Between its steps it polls
// the round (MPI progresses it there); once the round is done it adds `average - snapshot` to the
// shared copy, so the updates the node's workers made while the round ran are kept:
//   copy = average + (the node's updates since the snapshot).
// A round still running when the next one is due is waited for then, bounded by the timeout.
// Every leader takes the same number of steps between two meetings of the job (equal shards give
// equal steps per epoch), so every leader starts the same rounds; a meeting checks that, and ranks
// that took different numbers of steps are an InvalidArgument on every rank rather than a hang.
//
// Meetings. gather() is the job's only collective over all ranks (barriers, scalar reductions,
// checkpoints go through it): every rank's values, rank-major, over an MPI communicator of the
// whole world. When any rank stepped since the last full average, every leader then finishes its
// round and the leaders average the copies once more, in place, while every worker of every node
// waits (the node's barrier): after it every node holds the same bits. The Trainer meets at each
// epoch's end, so rank 0 evaluates and checkpoints the job's average, and every node starts the
// next epoch from it.
//
// Ownership: owns its two communicators and the round's buffers (two copies of the parameters, on
// the leaders); borrows the node's shared parameters and the node barrier. Thread safety: the
// training thread only. Collective: the constructor and gather() on every rank of the world, in the
// same order; afterStep() after each of this rank's optimizer steps. Every wait is bounded by the
// timeout and names the ranks it waited for (TimeoutError, PeerError).
// Test hook: NodeAveragingOptions::testLogDir (TestHooks::averageLogDir) = DIR makes each leader
// append to DIR/average.rank<R> a line "average K DIGEST rounds N" after the K-th full average
// (DIGEST: of the node's copy then; N: the overlapped rounds finished so far) and "loaded DIGEST"
// after a checkpoint was loaded.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/world_info.h"
#include "train/observe/timeline.h"

namespace cohort::train {

struct NodeAveragingOptions {
  runtime::WorldInfo world;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  int64_t every = 16;       // leader steps per round, >= 1
  std::span<float> params;  // the node's shared copy
  // Lines up the workers of this node (named by what they wait for).
  std::function<void(const std::string& what)> nodeBarrier;
  Timeline* timeline = nullptr;
  // Test hooks (train/test_hooks.h): the communicators' fault injection, and the log's directory
  // (see the header comment; empty: none).
  collectives::CommunicatorOptions::FaultInjection faultInjection = {};
  std::string testLogDir = {};
};

class NodeAveraging {
 public:
  // Collective over the world: makes the communicators, then gives every node the first node's
  // parameters (a broadcast among the leaders; an initialiser of the program's own need not be
  // deterministic) and lines up each node. Throws InvalidArgument (workers not started by mpirun
  // or srun with MPI) and as collectives::makeMpiCommunicator.
  explicit NodeAveraging(const NodeAveragingOptions& options);
  ~NodeAveraging();
  NodeAveraging(const NodeAveraging&) = delete;
  NodeAveraging& operator=(const NodeAveraging&) = delete;

  // After each optimizer step of this rank: the leader polls its round, and starts one every
  // `every` steps.
  void afterStep();
  // Collective: every rank's `mine` (the same length on every rank), rank-major; then the full
  // average when anyone stepped since the last (see the header comment).
  std::vector<double> gather(std::span<const double> mine);
  // Collective: every rank's `mine`, rank-major, as they are (no averaging; e.g. optimizer states).
  std::vector<float> gatherFloats(std::span<const float> mine);
  // After the leader loaded the copy from a checkpoint (between two meetings): for the test hook.
  void loaded() const;

  int64_t rounds() const { return rounds_; }              // overlapped rounds finished by this leader
  int64_t fullAverages() const { return fullAverages_; }  // at meetings

 private:
  bool leader() const { return world_.localRank == 0; }
  void startRound();
  void finishRound();
  void averageNow();
  void log(const std::string& what, const std::string& after) const;

  runtime::WorldInfo world_;
  std::chrono::milliseconds timeout_;
  int64_t every_;
  std::span<float> params_;
  std::function<void(const std::string&)> nodeBarrier_;
  Timeline* timeline_;
  std::unique_ptr<collectives::Communicator> all_;      // every rank of the world
  std::unique_ptr<collectives::Communicator> leaders_;  // color 0: every node's local rank 0; 1: the others (unused)
  std::vector<float> snapshot_, average_;               // the running round's (leaders)
  collectives::WorkPtr round_;
  int64_t steps_ = 0;          // this rank's steps since the last full average
  int64_t roundsStarted_ = 0;  // since the last full average (leaders)
  int64_t rounds_ = 0;
  int64_t fullAverages_ = 0;
  std::string logPath_;  // the test hook's file, or empty
};

}  // namespace cohort::train
