// HogwildStrategy: Hogwild on one node (mode hogwild; DESIGN.md §1). The parameters are one copy
// that every worker updates without locks: on the CPU in a shared segment (ipc::SharedParams), on
// GPUs in one device allocation of local rank 0 that the others open through CUDA IPC
// (ipc::DeviceShare, with its checks and owner-loss detection). Gradients, optimizer state and
// model buffers (BatchNorm statistics) stay private to each worker.
//
// Placement: local rank 0 initialises the parameters on the CPU (the same numbers as a CPU run) and
// copies them into the shared memory before publishing it; the other ranks wait for it (up to the
// timeout) and point their ParamBuffer into it. On the CPU each worker starts its optimizer sweep at
// a different element (hogwildSweepStart), so the workers do not fight over the same cache lines.
// Workers step on their own (lockstep() is false): they meet only where the loop calls barrier()
// or reduce(), e.g. at the end of each epoch.
// Checkpoints: every rank copies its optimizer state into its exchange area of the job segment, so
// rank 0 writes one file with everyone's ("optimizer.rank<k>.<state>", "optimizer_steps.rank<k>").
// A checkpoint of W workers loads on W' workers (docs/checkpoints.md): worker i takes the mean of
// the states, and of the step counts, of the saved workers hogwildStateSources() names.
// Ownership: owns the segments and the device share. Thread safety: as Strategy.
#pragma once

#include <memory>
#include <vector>

#include "ipc/device_share.h"
#include "ipc/shared_params.h"
#include "train/segment_strategy.h"

namespace cohort::train {

// Where rank `localRank`'s optimizer starts its sweep over the shared parameters (whole cache lines).
size_t hogwildSweepStart(size_t numel, int localRank, int localWorldSize);

// The saved workers whose optimizer state worker `rank` of `workers` takes over from a checkpoint of
// `savedWorkers`: those j with j = rank (mod min(savedWorkers, workers)), in order. The same number
// of workers: its own; fewer: a group of about savedWorkers / workers, merged by their mean; more:
// one, saved worker rank mod savedWorkers, copied (a worker that joins starts from a peer's moments).
std::vector<int> hogwildStateSources(int rank, int savedWorkers, int workers);

class HogwildStrategy final : public SegmentStrategy {
 public:
  // Every rank of the job constructs one, with the same model. Throws InvalidArgument (a world that
  // spans nodes; GPU Hogwild in a build without CUDA), and as ipc::SharedParams / ipc::DeviceShare.
  explicit HogwildStrategy(const StrategyContext& context);
  ~HogwildStrategy() override;

  StepResult step(const StepPlan& plan) override;
  bool lockstep() const override { return false; }
  SavedState saveState() override;
  void loadState(const CheckpointReader& reader) override;
  void checkPeers(std::chrono::milliseconds settle) override;

 private:
  void placeOnCpu(const StrategyContext& c);
  void placeOnGpu(const StrategyContext& c);

  std::unique_ptr<ipc::SharedParams> shared_;   // CPU
  std::unique_ptr<ipc::DeviceMemory> memory_;   // GPU: declared before the share that uses it
  std::unique_ptr<ipc::DeviceShare> deviceShare_;
  GradientSquares squares_;
  int rank_;
};

}  // namespace cohort::train
