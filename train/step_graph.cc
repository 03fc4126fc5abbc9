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

void StepGraph::run(const runtime::data::Batch& batch, const Body& body) {
  if (options_.enabled && !options_.offReason.empty()) turnOff(options_.offReason, runtime::LogLevel::kInfo);
  if (!options_.enabled) return body(batch);
  const std::vector<int64_t> key = keyOf(batch);
  if (exec_ && key == graphKey_) return replay(batch);
  if (!exec_ && key == warmKey_) return capture(batch, body);
  warmKey_ = key;  // a warm-up for these shapes, or shapes other than the graph's (a partial batch)
  body(batch);
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

void StepGraph::replay(const runtime::data::Batch& batch) {
  copyInto(inputs_.inputs, batch.inputs, gpu_);
  copyInto(inputs_.targets, batch.targets, gpu_);
  COHORT_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), streamOf(gpu_)));
  ++graphSteps_;
}

void StepGraph::capture(const runtime::data::Batch& batch, const Body& body) {
  runtime::cuda::CudaCachingAllocator& allocator = gpu_.allocator();
  inputs_ = runtime::data::Batch{.inputs = runtime::Tensor::empty(batch.inputs.shape(), allocator, batch.inputs.dtype()),
                                 .targets = runtime::Tensor::empty(batch.targets.shape(), allocator, batch.targets.dtype()),
                                 .index = batch.index,
                                 .size = batch.size};
  const runtime::Rng rngBefore = options_.rng ? *options_.rng : runtime::Rng();
  std::string failure;
  cudaStream_t stream = streamOf(gpu_);
  cudaError_t status = cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
  if (status == cudaSuccess) {
    pool_ = allocator.beginGraphCapture();
    try {
      body(inputs_);
    } catch (const std::exception& e) {
      failure = std::string("the step failed under capture: ") + e.what();
    }
    allocator.endGraphCapture();
    cudaGraph_t graph = nullptr;
    status = cudaStreamEndCapture(stream, &graph);
    graph_ = graph;
  }
  if (failure.empty() && status != cudaSuccess) {
    failure = std::string("capturing the step failed (") + cudaGetErrorName(status) + ")";
  }
  if (failure.empty() && options_.rng &&
      (options_.rng->counter() != rngBefore.counter() || options_.rng->seed() != rngBefore.seed())) {
    failure = "the step draws random numbers on the host (dropout), which a replay would repeat";
  }
  if (failure.empty()) {
    cudaGraphExec_t exec = nullptr;
    status = cudaGraphInstantiate(&exec, static_cast<cudaGraph_t>(graph_), 0);
    exec_ = exec;
    if (status != cudaSuccess) failure = std::string("instantiating the graph failed (") + cudaGetErrorName(status) + ")";
  }
  if (!failure.empty()) {
    destroyGraph();
    inputs_ = {};
    if (options_.rng) *options_.rng = rngBefore;
    turnOff(failure, runtime::LogLevel::kWarn);
    return body(batch);  // what the capture recorded never ran: the step runs eagerly
  }
  graphKey_ = keyOf(batch);
  replay(batch);
}

#else

StepGraph::~StepGraph() = default;
void StepGraph::destroyGraph() {}
void StepGraph::replay(const runtime::data::Batch&) {}
void StepGraph::capture(const runtime::data::Batch& batch, const Body& body) {
  turnOff("this build has no CUDA", runtime::LogLevel::kInfo);
  body(batch);
}

#endif

}  // namespace cohort::train
