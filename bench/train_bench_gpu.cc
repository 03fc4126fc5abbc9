// `cohort bench train --device cuda` (bench/train_bench.h): the step `cohort train` runs, timed. Each
// run is a train::Job of its own (local mode on the device) driven by train::Trainer, so the bench
// measures what a user's run does: the guarded optimizer (the finite check and the gradient norm on
// the device, train/step/step_guard.h), the loss reading bf16 logits in a bf16 pass, the deferred
// results, the device loader. A warm-up Trainer runs kTrainWarmupSteps steps; the clock runs around a
// second Trainer's steps on the same Job, from a drained stream to a drained stream.
//
// A speed is printed only for a run that learned: every run's timed steps must end with a finite
// mean loss below its warm-up's (the trainer stops a non-finite step with train::Diverged, exit 6;
// a loss that does not fall is refused the same way). The GPT's data are windows of bytes drawn from
// 16 values, whose loss falls from ln(vocabulary) towards ln 16 within the warm-up: a GPT's speed does
// not depend on which tokens it reads, but a broken path shows.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include "bench/train_bench.h"
#include "nn/loss.h"
#include "nn/model_spec.h"
#include "runtime/error.h"
#include "train/job.h"
#include "train/step.h"
#include "train/trainer.h"

#ifdef COHORT_HAVE_CUDA
#include <cuda_profiler_api.h>
#endif

namespace cohort::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct GpuRun {
  double samplesPerSecond = 0;
  double warmupLoss = 0, timedLoss = 0;
  runtime::AllocatorStats memory;  // the Job's caching allocator at the end, as cohort train's --memory-report
  std::string device;              // as the Job selected it (cuda:N)
};

train::TrainerOptions benchTrainer(const TrainBenchOptions& o, int64_t steps, uint64_t seed) {
  return {.epochs = 0,
          .batchSize = o.batchSize,
          .seed = seed,
          .maxSteps = steps,
          .clipGradNorm = o.clipGradNorm,
          .progressEverySeconds = 0,
          .cudaGraphs = o.cudaGraphs == "on",
          .logStartLine = false};
}

// Marks the timed steps for a profiler started with its capture range off (nsys
// --capture-range=cudaProfilerApi, ncu --profile-from-start off): bench/gpu_profile.sh.
void profilerRange(bool on) {
#ifdef COHORT_HAVE_CUDA
  const cudaError_t e = on ? cudaProfilerStart() : cudaProfilerStop();
  if (e != cudaSuccess) COHORT_THROW(Error) << "bench train: cudaProfiler" << (on ? "Start" : "Stop") << " failed";
#else
  (void)on;
#endif
}

GpuRun trainOnGpu(const TrainBenchOptions& o, const runtime::data::Dataset& data, uint64_t seed) {
  train::Job job({.device = o.device,
                  .convAlgorithms = runtime::parseConvAlgorithms(o.convAlgorithms),
                  .tf32 = o.tf32,
                  .gemmTuning = runtime::parseGemmTuning(o.gemmTuning, "--gemm-tuning"),
                  .precision = runtime::parseDType(o.precision, "--precision")});
  auto model = nn::buildModel(o.model);
  auto optimizer = job.makeOptimizer(benchOptimizer(o.model), *model);
  job.place(*model, *optimizer, {.seed = seed});
  nn::SoftmaxCrossEntropy loss;
  GpuRun run;
  run.warmupLoss = train::Trainer(job, loss, data, nullptr, benchTrainer(o, kTrainWarmupSteps, seed + 1000)).run().trainLoss;
  const int64_t steps = std::max<int64_t>(1, o.samples / o.batchSize);
  train::Trainer timed(job, loss, data, nullptr, benchTrainer(o, steps, seed));
  if (o.profile) profilerRange(true);
  const auto start = Clock::now();
  const train::TrainResult result = timed.run();  // returns with every step settled: the stream is done
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (o.profile) profilerRange(false);
  run.samplesPerSecond = static_cast<double>(result.steps * o.batchSize) / seconds;
  run.timedLoss = result.trainLoss;
  if (const std::optional<runtime::AllocatorStats> memory = job.deviceMemoryStats()) run.memory = *memory;
  run.device = job.device().str();
  if (!std::isfinite(run.timedLoss) || !(run.timedLoss < run.warmupLoss)) {
    COHORT_THROW(train::Diverged) << "bench train: " << o.model << " did not learn (mean loss " << run.warmupLoss
                                  << " over the " << kTrainWarmupSteps << " warm-up steps, " << run.timedLoss << " over the "
                                  << result.steps << " timed steps): no speed is reported for a broken path";
  }
  return run;
}

}  // namespace

nn::OptimizerOptions benchOptimizer(const std::string& model) {
  // The peers' optimizers (bench-peers' gpu_torch.py): SGD with momentum for the classifiers, AdamW for a GPT.
  return isGpt(model) ? nn::OptimizerOptions{.kind = nn::OptimizerKind::kAdamW, .lr = 3e-3f, .weightDecay = 0.01f}
                      : nn::OptimizerOptions{.kind = nn::OptimizerKind::kSgd, .lr = 0.01f, .momentum = 0.9f};
}

int runTrainBenchGpu(const TrainBenchOptions& o, const runtime::data::Dataset& data, int64_t context) {
  std::vector<double> runs;
  std::string device;
  double peakGib = 0, peakReservedGib = 0, warmupLoss = 0, timedLoss = 0;
  for (int r = 0; r < o.repeats; ++r) {
    const GpuRun run = trainOnGpu(o, data, static_cast<uint64_t>(r));
    runs.push_back(run.samplesPerSecond);
    peakGib = std::max(peakGib, static_cast<double>(run.memory.peakAllocatedBytes) / (1u << 30));
    peakReservedGib = std::max(peakReservedGib, static_cast<double>(run.memory.peakReservedBytes) / (1u << 30));
    device = run.device;
    warmupLoss = run.warmupLoss;
    timedLoss = run.timedLoss;
  }
  std::printf("RESULT bench=train model=%s device=%s batch=%lld conv_algorithms=%s precision=%s tf32=%s "
              "samples_per_s=%.0f min=%.0f max=%.0f peak_mem_gib=%.3f peak_reserved_gib=%.3f warmup_loss=%.4f "
              "loss=%.4f",
              o.model.c_str(), device.c_str(), static_cast<long long>(o.batchSize), o.convAlgorithms.c_str(),
              o.precision.c_str(), o.tf32 ? "yes" : "no", median(runs), *std::min_element(runs.begin(), runs.end()),
              *std::max_element(runs.begin(), runs.end()), peakGib, peakReservedGib, warmupLoss, timedLoss);
  if (isGpt(o.model)) std::printf(" tokens_per_s=%.0f", median(runs) * static_cast<double>(context));
  std::printf("\n");
  return 0;
}

}  // namespace cohort::bench
