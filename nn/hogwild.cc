#include "nn/hogwild.h"

#include <cstring>

#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "ipc/cuda_device_memory.h"
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/gpu_context.h"
#endif

namespace cohort::nn {

std::unique_ptr<ipc::SharedParams> shareParams(Model& model, const HogwildOptions& o,
                                               const std::function<void()>& initialise) {
  ipc::SharedParams::Options so;
  so.jobId = o.jobId;
  so.localRank = o.localRank;
  so.localWorldSize = o.localWorldSize;
  so.numel = model.params.numel();
  so.scratchFloatsPerRank = o.scratchFloatsPerRank;
  so.extraFloats = o.extraFloats;
  so.generation = o.generation;
  so.timeout = o.timeout;
  // Rank 0 leaves after the last barrier, when everyone has attached: removing the name then is safe
  // and keeps /dev/shm clean under mpirun or srun too (cohortrun removes the job's segments anyway).
  so.unlinkOnDestroy = o.localRank == 0;
  auto shared = std::make_unique<ipc::SharedParams>(so, [&](float* values, size_t) {
    model.params.attach(values, runtime::Device::cpu(), runtime::cpuAllocator());
    initialise();
  });
  if (!model.params.bound()) model.params.attach(shared->values(), runtime::Device::cpu(), runtime::cpuAllocator());
  return shared;
}

GpuShare shareParamsOnGpu(Model& model, const HogwildOptions& o, runtime::cuda::GpuContext& gpu,
                          const std::function<void(Model& host)>& initialise) {
#ifdef COHORT_HAVE_CUDA
  GpuShare share;
  ipc::SharedParams::Options so;
  so.jobId = o.jobId;
  so.localRank = o.localRank;
  so.localWorldSize = o.localWorldSize;
  so.numel = 1;  // the parameters are on the GPU
  so.scratchFloatsPerRank = o.scratchFloatsPerRank;
  so.generation = o.generation;
  so.timeout = o.timeout;
  so.unlinkOnDestroy = o.localRank == 0;
  share.segment = std::make_unique<ipc::SharedParams>(so, nullptr);
  share.memory = std::make_unique<ipc::CudaDeviceMemory>(gpu.device());
  const size_t bytes = model.params.numel() * sizeof(float);
  share.params = std::make_unique<ipc::DeviceShare>(*share.memory,
                                                    ipc::DeviceShare::Options{.jobId = o.jobId,
                                                                              .localRank = o.localRank,
                                                                              .localWorldSize = o.localWorldSize,
                                                                              .bytes = bytes,
                                                                              .generation = o.generation,
                                                                              .timeout = o.timeout},
                                                    [&](void* device, size_t n) {
                                                      std::unique_ptr<Model> host = buildModel(model.spec);
                                                      host->params.allocate(runtime::cpuAllocator());
                                                      initialise(*host);
                                                      runtime::cuda::copyToDevice(device, host->params.values().data(),
                                                                                  n, gpu.stream());
                                                      gpu.stream().synchronize();
                                                    });
  model.params.attach(static_cast<float*>(share.params->data()), gpu.device(), gpu.allocator());
  runtime::cuda::fill({model.params.grads().data(), model.params.numel()}, 0.0f, gpu.stream());
  if (model.params.bufferNumel() > 0) {
    // BatchNorm's running statistics stay private to each rank (as on the CPU): their initial values.
    std::unique_ptr<Model> host = buildModel(model.spec);
    host->params.allocate(runtime::cpuAllocator());
    model.params.buffers().copyFrom(host->params.buffers());
  }
  gpu.stream().synchronize();
  return share;
#else
  (void)model, (void)o, (void)gpu, (void)initialise;
  COHORT_THROW(InvalidArgument) << "GPU Hogwild needs a build with CUDA";
#endif
}

SegmentSync::SegmentSync(ipc::SharedParams& shared, std::chrono::milliseconds timeout)
    : shared_(shared), timeout_(timeout) {}

size_t hogwildSweepStart(size_t numel, int localRank, int localWorldSize) {
  size_t start = numel / static_cast<size_t>(localWorldSize) * static_cast<size_t>(localRank);
  return start / 16 * 16;  // a whole cache line of floats
}

void SegmentSync::barrier(const std::string& what) {
  shared_.barrier().arriveAndWait(shared_.localRank(), {.what = what, .timeout = timeout_});
  // Every rank attached before its first barrier, so the name is no longer needed: removed now, a
  // killed job leaves nothing in /dev/shm under srun or mpirun, where no launcher sweeps it (and a
  // requeued SLURM job, which keeps its id, finds no stale segment).
  if (!unlinked_ && shared_.localRank() == 0) {
    shared_.unlinkName();
    unlinked_ = true;
  }
}

// startNs = 0 and endNs = the rank's cumulative training time: the job's training time is the slowest
// rank's, evaluation and checkpoint pauses excluded.
void SegmentSync::reportProgress(int64_t samples, double trainSeconds, int64_t optimizerSteps) {
  ipc::RankStats& s = shared_.stats(shared_.localRank());
  s.startNs.store(0, std::memory_order_relaxed);
  s.endNs.store(static_cast<int64_t>(trainSeconds * 1e9), std::memory_order_relaxed);
  s.samples.store(samples, std::memory_order_relaxed);
  s.steps.store(optimizerSteps, std::memory_order_release);
}

JobProgress SegmentSync::jobProgress() const {
  JobProgress p;
  for (int r = 0; r < shared_.localWorldSize(); ++r) {
    const ipc::RankStats& s = shared_.stats(r);
    p.samples += s.samples.load(std::memory_order_acquire);
    p.trainSeconds = std::max(p.trainSeconds, static_cast<double>(s.endNs.load() - s.startNs.load()) * 1e-9);
  }
  return p;
}

std::vector<int64_t> SegmentSync::optimizerSteps() const {
  std::vector<int64_t> steps;
  for (int r = 0; r < shared_.localWorldSize(); ++r)
    steps.push_back(shared_.stats(r).steps.load(std::memory_order_acquire));
  return steps;
}

void HogwildSync::optimizerStep(Optimizer& optimizer, const Tensor& params, const Tensor& grads) {
  if (deviceShare_) deviceShare_->throwIfOwnerLost();
  optimizer.step(params, grads);
}

void HogwildSync::shareOptimizerState(const Optimizer& optimizer) {
  float* out = shared_.scratch(shared_.localRank());
  size_t used = 0;
  for (const auto& s : optimizer.state()) {
    COHORT_CHECK(used + static_cast<size_t>(s.tensor.numel()) <= shared_.scratchFloatsPerRank());
    Tensor::view(out + used, s.tensor.shape()).copyFrom(s.tensor);  // from the host or a GPU
    used += static_cast<size_t>(s.tensor.numel());
  }
}

std::vector<NamedTensor> HogwildSync::gatheredOptimizerState(const Optimizer& optimizer) const {
  std::vector<NamedTensor> all;
  for (int r = 0; r < shared_.localWorldSize(); ++r) {
    size_t used = 0;
    for (const auto& s : optimizer.state()) {  // every rank's state has the same names and sizes
      all.push_back({"optimizer.rank" + std::to_string(r) + "." + s.name,
                     Tensor::view(shared_.scratch(r) + used, s.tensor.shape())});
      used += static_cast<size_t>(s.tensor.numel());
    }
  }
  return all;
}

}  // namespace cohort::nn
