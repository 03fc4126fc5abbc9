// HogwildPlacement: the placement of Hogwild (mode hogwild; docs/architecture.md, "hogwild, one node"). The
// parameters are one copy per node that every worker of the node updates without locks: on the CPU
// in a shared segment (ipc::SharedParams), on GPUs in one device allocation of local rank 0 that
// the others open through CUDA IPC (ipc::DeviceShare, with its checks and owner-loss detection).
// Gradients, optimizer state and model buffers (BatchNorm statistics) stay private to each worker.
//
// Placement: local rank 0 initialises the parameters on the CPU (the same numbers as a CPU run) and
// copies them into the shared memory before publishing it; the other ranks wait for it (up to the
// timeout) and point their ParamBuffer into it. On the CPU each worker starts its optimizer sweep at
// a different element (hogwildSweepStart, by local rank), so the workers do not fight over the same
// cache lines. Workers step on their own (its collectives' lockstep() is false): they meet only where
// the loop calls a collective (barrier, reduce), e.g. at the end of each epoch. Each step is the one
// pipeline's (train/step/step_pipeline.h) over the worker's own whole gradient: no reduction, no vote,
// beginStep checks that the GPU share's owner is alive, endStep gives the averaging its turn.
// Across nodes (CPU only): every node has its own copy (segments are per node: each node has its
// own /dev/shm), and train::NodeAveraging averages the nodes' copies over MPI every
// HogwildOptions::averageEvery steps of each node's leader, overlapped with training, and fully at
// every meeting (barrier, reduce, checkpoint), so the job's meetings see one model. Its collectives
// then span the whole world.
// Checkpoints: rank 0 writes one file with every worker's optimizer state ("optimizer.rank<k>.<state>",
// "optimizer_steps.rank<k>", k the world rank): on one node every rank copies its state into its
// exchange area of the job segment; across nodes the states are gathered over MPI, after the full
// average, so the file holds the average of the nodes' copies.
// A checkpoint of W workers loads on W' workers (docs/checkpoints.md): worker i takes the mean of
// the states, and of the step counts, of the saved workers hogwildStateSources() names.
// Ownership: owns the segments, the device share and the averaging. Thread safety: as Placement.
#pragma once

#include <memory>
#include <vector>

#include "ipc/device_share.h"
#include "ipc/shared_params.h"
#include "train/placement/node_averaging.h"
#include "train/placement/segment_placement.h"

namespace cohort::train {

// Where rank `localRank`'s optimizer starts its sweep over the shared parameters (whole cache lines).
size_t hogwildSweepStart(size_t numel, int localRank, int localWorldSize);

// The saved workers whose optimizer state worker `rank` of `workers` takes over from a checkpoint of
// `savedWorkers`: those j with j = rank (mod min(savedWorkers, workers)), in order. The same number
// of workers: its own; fewer: a group of about savedWorkers / workers, merged by their mean; more:
// one, saved worker rank mod savedWorkers, copied (a worker that joins starts from a peer's moments).
std::vector<int> hogwildStateSources(int rank, int savedWorkers, int workers);

struct HogwildOptions {
  // Across nodes: the nodes' copies are averaged every this many steps of each node's leader
  // (>= 1; train::NodeAveraging). Unused on one node.
  int64_t averageEvery = 16;
};

class HogwildPlacement final : public SegmentPlacement {
 public:
  // Every rank of the job constructs one, with the same model (collective). Throws InvalidArgument
  // (GPU Hogwild in a build without CUDA, or across nodes; across nodes without MPI), and as
  // ipc::SharedParams / ipc::DeviceShare / collectives::makeMpiCommunicator.
  explicit HogwildPlacement(const PlacementContext& context, const HogwildOptions& options = {});
  ~HogwildPlacement() override;

  std::unique_ptr<JobCollectives> makeCollectives() override;
  SavedState saveState() override;
  void loadState(const CheckpointReader& reader) override;

  void beginStep(const StepPlan& plan) override;
  void reduceGradients(const StepPlan&, LossVote&) override {}  // each worker steps its own gradient
  int gradientRank() const override { return rank_; }
  // The whole-gradient stages, over this worker's own gradient.
  PartialNorm squaredNorm(const StepPlan& plan) override { return whole_.squaredNorm(plan); }
  void update(const StepPlan& plan, float clip) override { whole_.update(plan, clip); }
  StepResult stepDeferred(const StepPlan& plan, LossVerdict loss) override {
    return whole_.stepDeferred(plan, loss, rank_);
  }
  void endStep(const StepResult& result) override;
  // Across nodes: the averaging (rounds and full averages so far); nullptr on one node.
  const NodeAveraging* averaging() const { return averaging_.get(); }

 private:
  void placeOnCpu(const PlacementContext& c);
  void placeOnGpu(const PlacementContext& c);
  SavedState saveAcrossNodes();
  // Across nodes: the node's barrier (naming a missing local worker), then the meeting of the whole
  // world, which averages the copies when anyone stepped.
  void barrier(const std::string& what);

  WholeGradient whole_;  // the stages over this worker's own gradient

  std::unique_ptr<ipc::SharedParams> shared_;  // CPU
  std::unique_ptr<ipc::DeviceMemory> memory_;  // GPU: declared before the share that uses it
  std::unique_ptr<ipc::DeviceShare> deviceShare_;
  std::unique_ptr<NodeAveraging> averaging_;  // across nodes
  std::vector<float> gatheredStates_;         // across nodes: every rank's optimizer state, for saveState
  int rank_;
  int worldSize_;
};

}  // namespace cohort::train
