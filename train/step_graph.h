// StepGraph: a training step captured once as a CUDA graph and replayed (TrainerOptions::cudaGraphs,
// `cohort train --cuda-graphs`), so that a step costs one launch instead of hundreds: its forward and
// backward and, where the step is deferred (the default on a GPU), its Σ g², the step guard's judge
// and the optimizer's update.
//
// Per batch of the compute stream, run(batch, body, step) does one of three things:
//   eager    the body as it is (kernels enqueued one by one), then the step: graphs off, a step whose
//            shapes differ from the graph's (the epoch's last, partial batch), or the first step of
//            new shapes (the warm-up: it fills the allocator's cache, creates library handles,
//            chooses algorithms, builds the optimizer's chunk table);
//   capture  the second step of the same shapes: the batch is copied into device buffers of the
//            graph's own, the body runs under cudaStreamBeginCapture (global mode: any host wait
//            inside it fails) with the allocator's graph pool (caching_allocator.h), then the step,
//            whose device work (finishStep's `device`) joins the capture; the graph is instantiated
//            and launched for this step;
//   replay   later steps of those shapes: the batch copied into those buffers, the step's host part
//            run, the graph launched.
// The step (Job::step, through StepOptions::graph) hands its device work to finishStep(stage,
// device): `stage` enqueues what changes every step and must not be captured (the judge's options,
// the optimizer's learning rates and bias corrections, written into device memory by one tiny
// kernel each), before the launch; `device` enqueues the kernels that read them through pointers
// that never change (Σ g², judge, the optimizer's one multi-tensor kernel), captured once. The
// step's record is copied into its ring slot after the launch, uncaptured (its slot changes every
// step). What is read back after it (the loss sums, the parameters, the record) is where the eager
// step would have left it, bit for bit: the replay runs the captured kernels with their arguments,
// which read the step's values from where the uncaptured write put them.
//
// What is not captured, and why (docs/gpu.md, "CUDA graphs"): a synchronous step
// (withStep false: `--synchronous-steps`, which waits for its norm on the host) runs eagerly after
// the launch; steps of several micro-batches, the multi-process modes and a loss other than
// Cohort's own (one may decide on the host what it enqueues each step): not offered (the Trainer
// passes the reason as offReason). The body's contract: what it enqueues depends on the batch's
// shapes and the Rng only. A capture that fails (a host wait, a copy from pageable memory inside
// the step, an error) or that drew random numbers on the host (dropout: its masks' seed is a kernel
// argument, so a replay would repeat the first step's) is discarded: the step runs eagerly, graphs
// stay off for the run, and one warning line names the reason.
// Ownership: owns the graph, its executable form, its input buffers and its allocator pool (released
// when destroyed). Borrows the GPU context, which must outlive it.
// Thread safety: the training thread only; everything is enqueued on the context's compute stream.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/data/data_loader.h"
#include "runtime/logging.h"
#include "runtime/random.h"

namespace cohort::runtime::cuda {
class GpuContext;
}

namespace cohort::train {

struct StepGraphOptions {
  bool enabled = true;
  // Why graphs are off though asked for (one warning line at the first step); empty: they are not.
  std::string offReason = {};
  // The host Rng the body may draw from (Pass::rng): a capture that advanced it is discarded.
  runtime::Rng* rng = nullptr;
  // The step's device work joins the graph: every step run() is given calls finishStep (a deferred
  // step, StepOptions::graph). False: the step runs after the launch, uncaptured.
  bool withStep = false;
};

class StepGraph {
 public:
  StepGraph(runtime::cuda::GpuContext& gpu, const runtime::Logger& log, StepGraphOptions options);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  using Body = std::function<void(const runtime::data::Batch& batch)>;
  using Work = std::function<void()>;
  // Runs `body` for `batch` (device tensors), eagerly, captured or replayed, then `step` (see the
  // header comment). Exceptions of an eager body and of the step propagate (a capture open when the
  // step throws is discarded first).
  void run(const runtime::data::Batch& batch, const Body& body, const Work& step);
  // The step's device work, called by the step that run() runs (exactly once where withStep):
  // eager, stage() then device(); capturing, device() into the graph, then stage() and the launch;
  // replaying, stage() and the launch.
  void finishStep(const Work& stage, const Work& device);

  // Steps whose body ran as the graph (the captured one included).
  int64_t graphSteps() const { return graphSteps_; }
  // The nodes (kernels and copies) of the captured graph; 0 before a capture.
  int64_t capturedNodes() const { return capturedNodes_; }
  // Why graphs went off for the run; empty while they are on.
  const std::string& fallbackReason() const { return fallback_; }

 private:
  // The shapes and types of a batch, which decide whether the graph fits it.
  static std::vector<int64_t> keyOf(const runtime::data::Batch& batch);
  void capture(const runtime::data::Batch& batch, const Body& body, const Work& step);
  // Ends the open capture and instantiates it: the reason it failed (`failure` if set), or empty.
  std::string endCapture(std::string failure);
  // After a failed capture: the graph discarded, the Rng restored, graphs off; the body runs eagerly.
  void discard(const std::string& failure, const runtime::data::Batch& batch, const Body& body);
  // The batch copied into the graph's buffers and the graph launched.
  void launch(const runtime::data::Batch& batch);
  // Off for the rest of the run: a configuration not offered (info), a failed capture (warn).
  void turnOff(const std::string& reason, runtime::LogLevel level);
  void destroyGraph();

  runtime::cuda::GpuContext& gpu_;
  const runtime::Logger& log_;
  StepGraphOptions options_;
  std::vector<int64_t> warmKey_;   // the shapes of the last eager step
  std::vector<int64_t> graphKey_;  // the shapes the graph was captured with
  runtime::data::Batch inputs_;    // the graph's own input buffers
  void* exec_ = nullptr;           // cudaGraphExec_t
  void* graph_ = nullptr;          // cudaGraph_t
  uint64_t pool_ = 0;              // the allocator's graph pool; 0: none
  int64_t graphSteps_ = 0;
  int64_t capturedNodes_ = 0;
  std::string fallback_;
  // Between run() and the step's finishStep: what the step's device work joins.
  enum class Pending { kNone, kCapture, kReplay };
  Pending pending_ = Pending::kNone;
  const runtime::data::Batch* pendingBatch_ = nullptr;
  const Body* pendingBody_ = nullptr;
  runtime::Rng rngBefore_;  // the Rng as the capture began
};

}  // namespace cohort::train
