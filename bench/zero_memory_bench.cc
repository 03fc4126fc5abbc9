#include "bench/zero_memory_bench.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <vector>

#include "nn/gpt.h"
#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/cpu/blas.h"
#include "runtime/error.h"
#include "runtime/process_memory.h"
#include "runtime/random.h"
#include "train/job.h"
#include "train/zero_memory.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#endif

namespace cohort::bench {

namespace {

// Sets this process's VmHWM to its VmRSS (Linux 4.0+, /proc/self/clear_refs "5"); false where the
// kernel refuses.
bool resetPeakResident() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return clear.good();
}

// What one rank measured of its placement.
struct Measured {
  train::StateBytes held;  // Job::stateBytes() after the steps
  double heldRss = 0;      // VmRSS after the placement less before the optimizer
  double peakRss = -1;     // VmHWM's growth over the optimizer and the placement; -1: not measured
  // On a GPU: the caching allocator's allocated bytes after the placement less before the
  // optimizer, and its peak allocated after the steps less the same (-1: on the CPU).
  double deviceHeld = -1, devicePeak = -1;
};

// `steps` AdamW steps on random tokens (a step may allocate what its units in flight need).
void train(train::Job& job, nn::Model& model, const nn::Gpt& gpt, const ZeroMemoryBenchOptions& o) {
  const int64_t context = gpt.options().context, vocab = gpt.options().vocab;
  runtime::Rng rng(static_cast<uint64_t>(17 + job.world().rank));
  runtime::Tensor ids = runtime::Tensor::zeros({o.batchSize, context});
  runtime::Tensor targets = runtime::Tensor::zeros({o.batchSize, context});
  nn::SoftmaxCrossEntropy loss;
  for (int s = 0; s < o.steps; ++s) {
    for (int64_t i = 0; i < ids.numel(); ++i) {
      ids.at(i) = static_cast<float>(rng.below(static_cast<uint64_t>(vocab)));
      targets.at(i) = static_cast<float>(rng.below(static_cast<uint64_t>(vocab)));
    }
    nn::Pass pass = job.pass();
#ifdef COHORT_HAVE_CUDA
    if (runtime::cuda::GpuContext* gpu = job.gpu()) {
      loss.forwardGpu(model.forward(ids.clone(gpu->allocator()), pass), targets.clone(gpu->allocator()), *gpu);
    } else
#endif
    {
      loss.forward(model.forward(ids, pass), targets);
    }
    model.net->backward(loss.backward(), pass);
    job.step();
  }
}

Measured placeAndMeasure(train::Job& job, nn::Model& model, const ZeroMemoryBenchOptions& o) {
  Measured m;
  const bool peak = resetPeakResident();
  const runtime::ProcessMemory before = runtime::processMemory();
  const std::optional<runtime::AllocatorStats> deviceBefore = job.deviceMemoryStats();
  auto optimizer = job.makeOptimizer({.kind = nn::OptimizerKind::kAdamW, .lr = 3e-3f, .weightDecay = 0.01f}, model);
  job.place(model, *optimizer, {.seed = 1});
  const runtime::ProcessMemory after = runtime::processMemory();
  if (const std::optional<runtime::AllocatorStats> s = job.deviceMemoryStats(); s && deviceBefore) {
    m.deviceHeld = static_cast<double>(s->allocatedBytes) - static_cast<double>(deviceBefore->allocatedBytes);
  }
  m.heldRss = static_cast<double>(after.residentBytes) - static_cast<double>(before.residentBytes);
  if (peak) m.peakRss = static_cast<double>(after.peakResidentBytes) - static_cast<double>(before.residentBytes);
  train(job, model, dynamic_cast<const nn::Gpt&>(*model.net), o);
  if (const std::optional<runtime::AllocatorStats> s = job.deviceMemoryStats(); s && deviceBefore) {
    m.devicePeak = static_cast<double>(s->peakAllocatedBytes) - static_cast<double>(deviceBefore->allocatedBytes);
  }
  m.held = job.stateBytes();
  return m;
}

double ratio(double measured, double formula) { return formula > 0 ? measured / formula : (measured > 0 ? 0.0 : 1.0); }

void printRank(const ZeroMemoryBenchOptions& o, const train::Job& job, int group, const Measured& m,
               const train::StateBytes& f) {
  const train::StateBytes& h = m.held;
  const double total = static_cast<double>(h.total());
  std::printf(
      "RESULT bench=zero_memory model=%s zero=%d scope=%s world_size=%d group=%d rank=%d params=%zu grads=%zu "
      "optimizer=%zu staging=%zu formula_params=%zu formula_grads=%zu formula_optimizer=%zu formula_staging=%zu "
      "model_state_ratio=%.4f staging_ratio=%.4f held_rss=%.0f held_ratio=%.3f peak_rss=%.0f peak_ratio=%.3f",
      o.model.c_str(), o.zero, o.zeroScope.c_str(), job.world().worldSize, group, job.world().rank, h.params, h.grads,
      h.optimizer, h.staging, f.params, f.grads, f.optimizer, f.staging,
      ratio(static_cast<double>(h.params + h.grads + h.optimizer),
            static_cast<double>(f.params + f.grads + f.optimizer)),
      ratio(static_cast<double>(h.staging), static_cast<double>(f.staging)), m.heldRss, m.heldRss / total, m.peakRss,
      m.peakRss / total);
  if (m.deviceHeld >= 0) {
    std::printf(" device_held=%.0f device_ratio=%.4f device_peak=%.0f device_peak_ratio=%.3f", m.deviceHeld,
                m.deviceHeld / static_cast<double>(f.params + f.grads + f.optimizer), m.devicePeak,
                m.devicePeak / static_cast<double>(f.total()));
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

void addZeroMemoryBenchFlags(CLI::App& c, ZeroMemoryBenchOptions& o) {
  c.add_option("--model", o.model, "a GPT (gpt:layers=L,heads=H,dim=D,ctx=T,vocab=V)")->capture_default_str();
  c.add_option("--zero", o.zero, "the ZeRO stage of this job: 0 (replicas), 1, 2 or 3")->capture_default_str();
  c.add_option("--zero-scope", o.zeroScope, "job (shard over every rank) or node (over each node's)")
      ->capture_default_str();
  c.add_option("--batch-size", o.batchSize, "samples per step and rank")->capture_default_str();
  c.add_option("--steps", o.steps, "training steps after the placement")->capture_default_str();
  c.add_option("--threads", o.threads, "BLAS threads per rank")->capture_default_str();
  c.add_option("--device", o.device, "cpu, or cuda (one GPU per rank: the caching allocator's bytes besides)")
      ->capture_default_str();
}

int runZeroMemoryBench(const ZeroMemoryBenchOptions& o) {
  if (o.model.rfind("gpt:", 0) != 0 || o.batchSize < 1 || o.steps < 1) {
    COHORT_THROW(InvalidArgument) << "cohort bench memory needs a GPT (--model gpt:…), --batch-size and --steps of 1 "
                                     "or more, got "
                                  << o.model << ", " << o.batchSize << " and " << o.steps;
  }
  const train::ZeroScope scope = train::parseZeroScope(o.zeroScope);
  runtime::cpu::setBlasThreads(o.threads);
  std::optional<train::Job> job;
  try {
    job.emplace(
        train::JobOptions{.mode = train::Mode::kAllReduce,
                          // Stage 0 on the CPU: a replica per rank, ZeRO's baseline (GPUs always replicate).
                          .paramCopies = o.zero == 0 && o.device == "cpu" ? train::ParamCopies::kReplicas
                                                                          : train::ParamCopies::kAuto,
                          .zero = o.zero,
                          .zeroScope = scope,
                          .device = o.device});
  } catch (const InvalidArgument& refused) {
    const runtime::WorldInfo world = runtime::WorldInfo::detect();
    if (world.rank == 0) {
      std::printf("RESULT bench=zero_memory model=%s zero=%d scope=%s world_size=%d status=refused reason: %s\n",
                  o.model.c_str(), o.zero, o.zeroScope.c_str(), world.worldSize, refused.what());
    }
    return 0;
  }
  auto model = nn::buildModel(o.model);
  std::vector<size_t> units;
  for (const auto& u : model->params.units()) units.push_back(u.numel);
  const int group = o.zero == 0 ? 1 : train::shardGroupSize(job->world(), scope);
  const train::StateBytes formula = train::zeroStateBytes(
      {.units = units, .stage = o.zero, .groupSize = group, .optimizer = {.kind = nn::OptimizerKind::kAdamW}});
  const Measured measured = placeAndMeasure(*job, *model, o);
  printRank(o, *job, group, measured, formula);
  job->barrier("zero-memory-bench");
  return 0;
}

}  // namespace cohort::bench
