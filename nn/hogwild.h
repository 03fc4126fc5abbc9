// Hogwild on one node: a model's parameters in a shared segment (ipc::SharedParams) that every
// worker updates without locks, and the JobSync the Trainer uses to line the workers up.
//
// shareParams(): local rank 0 creates the segment, points the model's ParamBuffer into it, runs
// `initialise` (reset or load the parameters) and publishes it; the other ranks wait for it (up to
// the timeout) and point their ParamBuffer into the same memory. Gradients and optimizer state stay
// private to each worker. Each rank's segment scratch area holds a copy of its optimizer state at
// checkpoint time, so rank 0 can write one checkpoint with everyone's.
// Every rank of the job must call shareParams() with the same options; all ranks are on this node
// (callers refuse a world that spans nodes). Thread safety: one training thread per process.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "ipc/device_share.h"
#include "ipc/shared_params.h"
#include "nn/job_sync.h"
#include "nn/model_spec.h"

namespace cohort::runtime::cuda {
class GpuContext;
}

namespace cohort::nn {

struct HogwildOptions {
  std::string jobId;
  int localRank = 0;
  int localWorldSize = 1;
  uint64_t generation = 0;          // the launcher's restart count: a restarted job makes a fresh segment
  size_t scratchFloatsPerRank = 0;  // Hogwild: optimizer state, for gathering checkpoints; sharded: gradients
  size_t extraFloats = 0;           // shared by all ranks (sharded: the optimizer state)
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

std::unique_ptr<ipc::SharedParams> shareParams(Model& model, const HogwildOptions& options,
                                               const std::function<void()>& initialise);

// GPU Hogwild (DESIGN.md §1): the parameters live in one device allocation of local rank 0 that the
// other local ranks open through CUDA IPC (ipc::DeviceShare, with its checks and owner-loss
// detection); a host segment as for shareParams() still carries the barrier, the progress slots and
// each rank's optimizer state for checkpoints (its values area is unused). Local rank 0 builds a CPU
// copy of the model, lets `initialise` fill it (reset or load a checkpoint: the same numbers as a
// CPU run) and copies it to its GPU; every rank then points `model`'s ParamBuffer at the shared
// device memory, with gradients and BatchNorm buffers private in `gpu`'s allocator.
// Members are declared so that the device share goes before the segment and the memory it uses.
struct GpuShare {
  std::unique_ptr<ipc::SharedParams> segment;
  std::unique_ptr<ipc::DeviceMemory> memory;
  std::unique_ptr<ipc::DeviceShare> params;
};
// Throws InvalidArgument in a build without CUDA; otherwise as ipc::DeviceShare and SharedParams.
GpuShare shareParamsOnGpu(Model& model, const HogwildOptions& options, runtime::cuda::GpuContext& gpu,
                          const std::function<void(Model& host)>& initialise);

// Where rank `localRank`'s optimizer starts its sweep over the shared parameters (Optimizer::
// setSweepStart), so the workers' updates begin on different cache lines.
size_t hogwildSweepStart(size_t numel, int localRank, int localWorldSize);

// The parts of a JobSync that live in the shared segment: its barrier, and the per-rank stats slots
// for the job's progress figures and optimizer step counts.
class SegmentSync : public JobSync {
 public:
  SegmentSync(ipc::SharedParams& shared, std::chrono::milliseconds timeout);

  void barrier(const std::string& what) override;
  void reportProgress(int64_t samples, double trainSeconds, int64_t optimizerSteps) override;
  JobProgress jobProgress() const override;
  std::vector<int64_t> optimizerSteps() const override;

 protected:
  ipc::SharedParams& shared_;
  std::chrono::milliseconds timeout_;
  bool unlinked_ = false;
};

class HogwildSync final : public SegmentSync {
 public:
  // With `deviceShare` (GPU Hogwild, importers), every optimizer step first checks that the owner of
  // the shared parameters is still there (PeerError naming it otherwise).
  HogwildSync(ipc::SharedParams& shared, std::chrono::milliseconds timeout,
              const ipc::DeviceShare* deviceShare = nullptr)
      : SegmentSync(shared, timeout), deviceShare_(deviceShare) {}

  void optimizerStep(Optimizer& optimizer, const Tensor& params, const Tensor& grads) override;
  // Copies the state (host or device) into this rank's scratch area.
  void shareOptimizerState(const Optimizer& optimizer) override;
  std::vector<NamedTensor> gatheredOptimizerState(const Optimizer& optimizer) const override;

 private:
  const ipc::DeviceShare* deviceShare_;
};

}  // namespace cohort::nn
