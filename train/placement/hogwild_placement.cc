#include "train/placement/hogwild_placement.h"

#include <algorithm>

#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "ipc/cuda_device_memory.h"
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/gpu_context.h"
#endif

namespace cohort::train {

size_t hogwildSweepStart(size_t numel, int localRank, int localWorldSize) {
  size_t start = numel / static_cast<size_t>(localWorldSize) * static_cast<size_t>(localRank);
  return start / 16 * 16;  // a whole cache line of floats
}

HogwildPlacement::HogwildPlacement(const PlacementContext& c, const HogwildOptions& o)
    : SegmentPlacement(c, c.optimizer.stateFloats(), NodeScope::kEachNode),
      whole_{c.params, c.optimizer, c.gpu},
      rank_(c.world.rank),
      worldSize_(c.world.worldSize) {
  if (c.gpu && c.world.spansNodes()) {
    COHORT_THROW(InvalidArgument) << "Hogwild across nodes averages the nodes' copies on the CPU: train on device cpu, "
                                     "or use mode allreduce on GPUs";
  }
  if (c.gpu) {
    placeOnGpu(c);
  } else {
    placeOnCpu(c);
  }
  if (c.world.spansNodes()) {
    averaging_ = std::make_unique<NodeAveraging>(
        NodeAveragingOptions{.world = c.world,
                             .timeout = c.timeout,
                             .every = o.averageEvery,
                             .params = {params_.values().data(), static_cast<size_t>(params_.numel())},
                             .nodeBarrier = [this](const std::string& what) { nodeBarrier(what); },
                             .timeline = &timeline_,
                             .faultInjection = faultInjectionOf(c.testHooks),
                             .testLogDir = c.testHooks.averageLogDir});
  }
}

HogwildPlacement::~HogwildPlacement() = default;

void HogwildPlacement::placeOnCpu(const PlacementContext& c) {
  shared_ = shareParams(c, 0, 0);
  optimizer_.setSweepStart(hogwildSweepStart(params_.numel(), localRank(), localWorldSize()));
}

void HogwildPlacement::placeOnGpu(const PlacementContext& c) {
#ifdef COHORT_HAVE_CUDA
  runtime::cuda::GpuContext& gpu = *c.gpu;
  memory_ = std::make_unique<ipc::CudaDeviceMemory>(gpu.device());
  deviceShare_ = std::make_unique<ipc::DeviceShare>(
      *memory_,
      ipc::DeviceShare::Options{.jobId = c.world.jobId,
                                .localRank = localRank(),
                                .localWorldSize = localWorldSize(),
                                .bytes = params_.bytes(),
                                .generation = static_cast<uint64_t>(c.world.restartCount),
                                .timeout = c.timeout},
      [&](void* device, size_t bytes) {
        c.initialise();
        runtime::cuda::copyToDevice(device, params_.values().data(), bytes, gpu.stream());
        gpu.stream().synchronize();
      });
  // Gradients and buffers (BatchNorm's running statistics, private to each rank as on the CPU) move
  // to this rank's GPU with their CPU values: zeros and the initial statistics.
  params_.relocate({.values = static_cast<float*>(deviceShare_->data()),
                    .device = gpu.device(),
                    .allocator = &gpu.allocator(),
                    .copyValues = false});
  if (localRank() == 0) unlinkAfterFirstBarrier([this] { deviceShare_->unlinkName(); });
#else
  (void)c;
  COHORT_THROW(InvalidArgument) << "GPU Hogwild needs a build with CUDA";
#endif
}

// Each worker checks and clips its own gradient: no rank waits for another.
void HogwildPlacement::beginStep(const StepPlan&) {
  if (deviceShare_) deviceShare_->throwIfOwnerLost();
}

void HogwildPlacement::endStep(const StepResult&) {
  if (averaging_) averaging_->afterStep();
}

// Across nodes the node's barrier comes first, so a missing local worker is named with `what`; the
// meeting of the whole world then averages the copies when anyone stepped.
void HogwildPlacement::barrier(const std::string& what) {
  nodeBarrier(what);
  if (averaging_) averaging_->gather({});
}

std::unique_ptr<JobCollectives> HogwildPlacement::makeCollectives() {
  SegmentCollectivesOptions o = nodeCollectives();
  o.lockstep = false;
  o.checkPeers = [this](std::chrono::milliseconds settle) {
    if (deviceShare_) deviceShare_->throwIfOwnerLost(settle);
  };
  if (averaging_) {
    o.barrier = [this](const std::string& what) { barrier(what); };
    o.gatherRows = [this](std::span<const double> mine, int& ranks) {
      ranks = worldSize_;
      return averaging_->gather(mine);
    };
  }
  return std::make_unique<SegmentCollectives>(std::move(o));
}

SavedState HogwildPlacement::saveState() {
  if (averaging_) return saveAcrossNodes();
  float* mine = segment_.exchange(localRank());
  size_t used = 0;
  for (const auto& s : optimizer_.state()) {
    COHORT_CHECK(used + static_cast<size_t>(s.tensor.numel()) <= segment_.exchangeFloatsPerRank());
    runtime::Tensor::view(mine + used, s.tensor.shape()).copyFrom(s.tensor);  // from the host or a GPU
    used += static_cast<size_t>(s.tensor.numel());
  }
  const double steps = static_cast<double>(optimizer_.steps());
  std::span<const double> allSteps = segment_.allGather({&steps, 1}, {.what = "checkpoint", .timeout = nodeTimeout_});
  SavedState saved;
  for (int r = 0; r < localWorldSize(); ++r) {
    used = 0;
    for (const auto& s : optimizer_.state()) {  // every rank's state has the same names and sizes
      saved.tensors.push_back({"optimizer.rank" + std::to_string(r) + "." + s.name,
                               runtime::Tensor::view(segment_.exchange(r) + used, s.tensor.shape())});
      used += static_cast<size_t>(s.tensor.numel());
    }
    saved.metadata["optimizer_steps.rank" + std::to_string(r)] =
        std::to_string(static_cast<int64_t>(allSteps[static_cast<size_t>(r)]));
  }
  saved.metadata["optimizer_steps"] = std::to_string(optimizer_.steps());
  return saved;
}

// Every rank's state goes to every rank (an all-gather: the one collective of the API that moves
// raw bytes), after the full average that gather() makes: the file holds the job's one model.
SavedState HogwildPlacement::saveAcrossNodes() {
  const double steps = static_cast<double>(optimizer_.steps());
  const std::vector<double> allSteps = averaging_->gather({&steps, 1});
  std::vector<float> mine;
  for (const auto& s : optimizer_.state()) {
    const size_t at = mine.size();
    mine.resize(at + static_cast<size_t>(s.tensor.numel()));
    runtime::Tensor::view(mine.data() + at, s.tensor.shape()).copyFrom(s.tensor);
  }
  gatheredStates_ = averaging_->gatherFloats(mine);
  SavedState saved;
  for (int r = 0; r < worldSize_; ++r) {
    size_t used = static_cast<size_t>(r) * mine.size();
    for (const auto& s : optimizer_.state()) {
      saved.tensors.push_back({"optimizer.rank" + std::to_string(r) + "." + s.name,
                               runtime::Tensor::view(gatheredStates_.data() + used, s.tensor.shape())});
      used += static_cast<size_t>(s.tensor.numel());
    }
    saved.metadata["optimizer_steps.rank" + std::to_string(r)] =
        std::to_string(static_cast<int64_t>(allSteps[static_cast<size_t>(r)]));
  }
  saved.metadata["optimizer_steps"] = std::to_string(optimizer_.steps());
  return saved;
}

std::vector<int> hogwildStateSources(int rank, int savedWorkers, int workers) {
  COHORT_CHECK(savedWorkers >= 1 && workers >= 1 && rank >= 0 && rank < workers)
      << "rank " << rank << " of " << workers << " workers, " << savedWorkers << " saved";
  const int groups = std::min(savedWorkers, workers);
  std::vector<int> sources;
  for (int j = rank % groups; j < savedWorkers; j += groups) sources.push_back(j);
  return sources;
}

// The shared parameters are loaded once per node, by local rank 0; each rank loads its own optimizer
// state (by world rank), or the mean of the saved workers' it takes over (hogwildStateSources) when
// the number of workers changed. The mean is taken in double on the host, in rank order, so every
// run gets the same bits. Across nodes the job meets first, so no round is running while the
// leaders overwrite the copies, and every node starts from the same loaded values.
void HogwildPlacement::loadState(const CheckpointReader& reader) {
  if (averaging_) averaging_->gather({});
  if (localRank() == 0) loadParams(reader, params_);
  if (averaging_ && localRank() == 0) averaging_->loaded();
  const auto saved = static_cast<int>(reader.count("world_size"));
  const std::vector<int> sources = hogwildStateSources(rank_, saved, worldSize_);
  auto name = [](int r, const std::string& state) { return "optimizer.rank" + std::to_string(r) + "." + state; };
  for (const auto& s : optimizer_.state()) {
    if (sources.size() == 1) {
      reader.load(name(sources[0], s.name), s.tensor);
      continue;
    }
    runtime::Tensor part = runtime::Tensor::empty(s.tensor.shape(), runtime::cpuAllocator());
    std::vector<double> sum(static_cast<size_t>(part.numel()), 0.0);
    for (int j : sources) {
      reader.load(name(j, s.name), part);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += part.data()[i];
    }
    const auto n = static_cast<double>(sources.size());
    for (size_t i = 0; i < sum.size(); ++i) part.data()[i] = static_cast<float>(sum[i] / n);
    s.tensor.copyFrom(part);
  }
  int64_t steps = 0;
  for (int j : sources) steps += reader.count("optimizer_steps.rank" + std::to_string(j));
  const auto n = static_cast<int64_t>(sources.size());
  optimizer_.setSteps((steps + n / 2) / n);  // the mean, rounded to the nearest
  barrier("loaded");
}

}  // namespace cohort::train
