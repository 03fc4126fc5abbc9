#include "bench/overlap_bench.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/cpu/blas.h"
#include "runtime/data/data_loader.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "train/job.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#include "runtime/data/device_loader.h"
#endif

namespace cohort::bench {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kWarmupSteps = 5;  // per run: the buckets, buffers and caches settle after a side change

// This rank's batches without end (a new epoch when one runs out): on a GPU through the DeviceLoader.
class Batches {
 public:
  Batches(const runtime::data::Dataset& data, const TrainBenchOptions& o, train::Job& job)
      : loader_(data, {.batchSize = o.batchSize, .seed = static_cast<uint64_t>(job.world().rank)}) {
#ifdef COHORT_HAVE_CUDA
    if (job.gpu()) device_ = std::make_unique<runtime::data::DeviceLoader>(loader_, *job.gpu());
#endif
    startEpoch();
  }
  void next(runtime::data::Batch& b) {
    while (!nextInEpoch(b)) startEpoch();
  }

 private:
  void startEpoch() {
#ifdef COHORT_HAVE_CUDA
    if (device_) return device_->startEpoch(epoch_++);
#endif
    loader_.startEpoch(epoch_++);
  }
  bool nextInEpoch(runtime::data::Batch& b) {
#ifdef COHORT_HAVE_CUDA
    if (device_) return device_->next(b);
#endif
    return loader_.next(b);
  }

  runtime::data::DataLoader loader_;
#ifdef COHORT_HAVE_CUDA
  std::unique_ptr<runtime::data::DeviceLoader> device_;
#endif
  int64_t epoch_ = 0;
};

// One training step through the Job; without overlap the pass carries no unit listener, so GradSync
// hears nothing during backward and starts every bucket in step() (GradSync::finish).
void trainStep(train::Job& job, nn::Model& model, nn::Loss& loss, Batches& batches, bool overlap) {
  runtime::data::Batch b;
  batches.next(b);
  nn::Pass pass = job.pass();
  if (!overlap) pass.units = nullptr;
  const runtime::Tensor& out = model.forward(b.inputs, pass);
#ifdef COHORT_HAVE_CUDA
  if (job.gpu()) {
    loss.forwardGpu(out, b.targets, *job.gpu());
  } else
#endif
  {
    loss.forward(out, b.targets);
  }
  model.net->backward(loss.backward(), pass);
  job.step();  // synchronous: returns when the step's result is known
}

// Seconds per step of `steps` steps after the warm-up, the slowest rank's.
double timeRun(train::Job& job, nn::Model& model, nn::Loss& loss, Batches& batches, bool overlap, int64_t steps) {
  for (int i = 0; i < kWarmupSteps; ++i) trainStep(job, model, loss, batches, overlap);
  job.barrier("overlap-bench-run");
  const auto start = Clock::now();
  for (int64_t i = 0; i < steps; ++i) trainStep(job, model, loss, batches, overlap);
  std::array<double, 1> seconds{std::chrono::duration<double>(Clock::now() - start).count() /
                                static_cast<double>(steps)};
  job.reduce(seconds, train::Reduce::kMax);
  return seconds[0];
}

bool prefetchOn(const std::string& prefetch) {
  if (prefetch != "on" && prefetch != "off")
    COHORT_THROW(InvalidArgument) << "bench train: --prefetch takes on or off, got '" << prefetch << "'";
  return prefetch == "on";
}

}  // namespace

int runOverlapBench(const TrainBenchOptions& o) {
  std::vector<bool> sides;
  for (const std::string& side : o.overlap) {
    if (side != "on" && side != "off")
      COHORT_THROW(InvalidArgument) << "bench train: --overlap takes on and off, got '" << side << "'";
    sides.push_back(side == "on");
  }
  if (sides.empty()) COHORT_THROW(InvalidArgument) << "bench train: --overlap needs at least one of on, off";
  const bool cuda = o.device.rfind("cuda", 0) == 0;
  const runtime::DType precision = runtime::parseDType(o.precision, "--precision");
  train::Job job({.mode = train::Mode::kAllReduce,
                  .paramCopies = cuda ? train::ParamCopies::kAuto : train::ParamCopies::kReplicas,  // GradSync on the CPU too
                  .zero = o.zero,
                  .zeroPrefetch = prefetchOn(o.prefetch),
                  .device = o.device,
                  .tf32 = o.tf32,
                  .gemmTuning = runtime::parseGemmTuning(o.gemmTuning, "--gemm-tuning"),
                  .precision = precision});
  runtime::cpu::setBlasThreads(o.threads.empty() ? 1 : o.threads.front());  // each worker's
  auto model = nn::buildModel(o.model);
  auto opt = job.makeOptimizer(benchOptimizer(o.model), *model);
  job.place(*model, *opt, {.seed = 1});
  const int64_t samples = o.samples > 0 ? o.samples : 30 * o.batchSize;  // per run and rank
  const int64_t steps = std::max<int64_t>(1, samples / o.batchSize);
  auto data = benchData(o.model, samples, o.batchSize);
  nn::SoftmaxCrossEntropy loss;
  loss.setGradType(precision);
  Batches batches(*data, o, job);
  const int workers = job.world().worldSize;
  const bool print = job.world().rank == 0;
  if (print) {
    std::printf(
        "# %s: %zu parameters in %zu units, %d workers, batch %lld per worker, %lld steps per run after %d warm-up\n",
        o.model.c_str(), model->params.numel(), model->params.units().size(), workers,
        static_cast<long long>(o.batchSize), static_cast<long long>(steps), kWarmupSteps);
    std::fflush(stdout);
  }
  std::vector<std::vector<double>> runs(sides.size());
  for (int r = 0; r < o.repeats; ++r) {
    for (size_t s = 0; s < sides.size(); ++s) runs[s].push_back(timeRun(job, *model, loss, batches, sides[s], steps));
  }
  std::vector<double> medians;
  for (size_t s = 0; s < sides.size(); ++s) {
    medians.push_back(median(runs[s]));
    if (!print) continue;
    std::printf(
        "RESULT bench=train_allreduce model=%s device=%s workers=%d batch=%lld zero=%d prefetch=%s overlap=%s "
        "step_ms=%.2f min=%.2f max=%.2f samples_per_s=%.0f\n",
        o.model.c_str(), o.device.c_str(), workers, static_cast<long long>(o.batchSize), o.zero, o.prefetch.c_str(),
        sides[s] ? "on" : "off",
        1e3 * medians[s], 1e3 * *std::min_element(runs[s].begin(), runs[s].end()),
        1e3 * *std::max_element(runs[s].begin(), runs[s].end()),
        static_cast<double>(workers * o.batchSize) / medians[s]);
  }
  const auto on = std::find(sides.begin(), sides.end(), true), off = std::find(sides.begin(), sides.end(), false);
  if (print && on != sides.end() && off != sides.end()) {
    std::printf("RESULT bench=train_allreduce model=%s device=%s workers=%d off_over_on=%.3f\n", o.model.c_str(),
                o.device.c_str(), workers, medians[off - sides.begin()] / medians[on - sides.begin()]);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace cohort::bench
