#include "train/step_graph.h"

#include <exception>

#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/gpu_context.h"
#endif

namespace cohort::train {

StepGraph::StepGraph(runtime::cuda::GpuContext& gpu, const runtime::Logger& log, StepGraphOptions options)
    : gpu_(gpu), log_(log), options_(std::move(options)) {}

std::vector<int64_t> StepGraph::keyOf(const runtime::data::Batch& batch) {
  std::vector<int64_t> key{batch.size};
  for (const runtime::Tensor* t : {&batch.inputs, &batch.targets}) {
    key.push_back(static_cast<int64_t>(t->dtype()));
    key.push_back(t->rank());
    for (int i = 0; i < t->rank(); ++i) key.push_back(t->shape()[i]);
  }
  return key;
}

void StepGraph::turnOff(const std::string& reason, runtime::LogLevel level) {
  fallback_ = reason;
  options_.enabled = false;
  (level == runtime::LogLevel::kWarn ? log_.warn() : log_.info())
      << "CUDA graphs off: " << reason << "; the training steps run uncaptured";
}

void StepGraph::run(const runtime::data::Batch& batch, const Body& body, const Work& step) {
  COHORT_CHECK(pending_ == Pending::kNone) << "a step graph run while the last step has not finished it";
  if (options_.enabled && !options_.offReason.empty()) turnOff(options_.offReason, runtime::LogLevel::kInfo);
  const std::vector<int64_t> key = options_.enabled ? keyOf(batch) : std::vector<int64_t>{};
  if (options_.enabled && exec_ && key == graphKey_) {
    if (!options_.withStep) {
      launch(batch);
      return step();
    }
    pending_ = Pending::kReplay;
    pendingBatch_ = &batch;
    step();
    COHORT_CHECK(pending_ == Pending::kNone) << "the step of a replayed graph did not finish it";
    return;
  }
  if (options_.enabled && !exec_ && key == warmKey_) return capture(batch, body, step);
  if (options_.enabled) warmKey_ = key;  // a warm-up for these shapes, or shapes other than the graph's (a partial batch)
  body(batch);
  step();
}

void StepGraph::finishStep(const Work& stage, const Work& device) {
  const Pending pending = pending_;
  pending_ = Pending::kNone;
  if (pending == Pending::kNone) {
    stage();
    return device();
  }
  const runtime::data::Batch& batch = *pendingBatch_;
  if (pending == Pending::kCapture) {
    std::string failure;
    try {
      device();
    } catch (const std::exception& e) {
      failure = std::string("the step failed under capture: ") + e.what();
    }
    failure = endCapture(failure);
    if (!failure.empty()) {
      discard(failure, batch, *pendingBody_);  // what the capture recorded never ran
      stage();
      return device();
    }
    graphKey_ = keyOf(batch);
  }
  stage();
  launch(batch);
}

#ifdef COHORT_HAVE_CUDA

namespace {

cudaStream_t streamOf(runtime::cuda::GpuContext& gpu) { return static_cast<cudaStream_t>(gpu.stream().native()); }

void copyInto(runtime::Tensor& into, const runtime::Tensor& from, runtime::cuda::GpuContext& gpu) {
  runtime::cuda::copyOnDevice(into.data(), from.data(), from.bytes(), gpu.stream());
}

}  // namespace

StepGraph::~StepGraph() { destroyGraph(); }

void StepGraph::destroyGraph() {
  // Destroying an executable graph while a launch runs is allowed (CUDA keeps it until done), and
  // the pool's blocks are reused in stream order only.
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = graph_ = nullptr;
  if (pool_) gpu_.allocator().releaseGraphPool(pool_);
  pool_ = 0;
  cudaGetLastError();
}

void StepGraph::launch(const runtime::data::Batch& batch) {
  copyInto(inputs_.inputs, batch.inputs, gpu_);
  copyInto(inputs_.targets, batch.targets, gpu_);
  COHORT_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), streamOf(gpu_)));
  ++graphSteps_;
}

void StepGraph::capture(const runtime::data::Batch& batch, const Body& body, const Work& step) {
  runtime::cuda::CudaCachingAllocator& allocator = gpu_.allocator();
  inputs_ = runtime::data::Batch{.inputs = runtime::Tensor::empty(batch.inputs.shape(), allocator, batch.inputs.dtype()),
                                 .targets = runtime::Tensor::empty(batch.targets.shape(), allocator, batch.targets.dtype()),
                                 .index = batch.index,
                                 .size = batch.size};
  rngBefore_ = options_.rng ? *options_.rng : runtime::Rng();
  std::string failure;
  const cudaError_t status = cudaStreamBeginCapture(streamOf(gpu_), cudaStreamCaptureModeGlobal);
  if (status != cudaSuccess) {
    discard(std::string("capturing the step failed (") + cudaGetErrorName(status) + ")", batch, body);
    return step();
  }
  pool_ = allocator.beginGraphCapture();
  try {
    body(inputs_);
  } catch (const std::exception& e) {
    failure = std::string("the step failed under capture: ") + e.what();
  }
  if (!options_.withStep || !failure.empty()) {
    failure = endCapture(failure);
    if (!failure.empty()) {
      discard(failure, batch, body);
      return step();
    }
    graphKey_ = keyOf(batch);
    launch(batch);
    return step();
  }
  // The capture stays open for the step's device work (finishStep).
  pending_ = Pending::kCapture;
  pendingBatch_ = &batch;
  pendingBody_ = &body;
  try {
    step();
  } catch (...) {
    if (pending_ == Pending::kCapture) {
      pending_ = Pending::kNone;
      endCapture("");
      destroyGraph();
      inputs_ = {};
    }
    throw;
  }
  COHORT_CHECK(pending_ == Pending::kNone) << "the step of a captured graph did not finish it";
}

std::string StepGraph::endCapture(std::string failure) {
  gpu_.allocator().endGraphCapture();
  cudaGraph_t graph = nullptr;
  cudaError_t status = cudaStreamEndCapture(streamOf(gpu_), &graph);
  graph_ = graph;
  if (failure.empty() && status != cudaSuccess) {
    failure = std::string("capturing the step failed (") + cudaGetErrorName(status) + ")";
  }
  if (failure.empty() && options_.rng &&
      (options_.rng->counter() != rngBefore_.counter() || options_.rng->seed() != rngBefore_.seed())) {
    failure = "the step draws random numbers on the host (dropout), which a replay would repeat";
  }
  if (failure.empty()) {
    size_t nodes = 0;
    status = cudaGraphGetNodes(graph, nullptr, &nodes);
    capturedNodes_ = static_cast<int64_t>(nodes);
    cudaGraphExec_t exec = nullptr;
    if (status == cudaSuccess) status = cudaGraphInstantiate(&exec, graph, 0);
    exec_ = exec;
    if (status != cudaSuccess) failure = std::string("instantiating the graph failed (") + cudaGetErrorName(status) + ")";
  }
  return failure;
}

void StepGraph::discard(const std::string& failure, const runtime::data::Batch& batch, const Body& body) {
  destroyGraph();
  inputs_ = {};
  capturedNodes_ = 0;
  if (options_.rng) *options_.rng = rngBefore_;
  turnOff(failure, runtime::LogLevel::kWarn);
  body(batch);
}

#else

StepGraph::~StepGraph() = default;
void StepGraph::destroyGraph() {}
void StepGraph::launch(const runtime::data::Batch&) {}
std::string StepGraph::endCapture(std::string failure) { return failure; }
void StepGraph::discard(const std::string&, const runtime::data::Batch& batch, const Body& body) { body(batch); }
void StepGraph::capture(const runtime::data::Batch& batch, const Body& body, const Work& step) {
  turnOff("this build has no CUDA", runtime::LogLevel::kInfo);
  body(batch);
  step();
}

#endif

}  // namespace cohort::train
