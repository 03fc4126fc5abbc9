#include "bench/train_bench.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/cpu/blas.h"
#include "runtime/data/data_loader.h"
#include "runtime/data/synthetic.h"
#include "runtime/error.h"

namespace cohort::bench {

using Clock = std::chrono::steady_clock;
using runtime::Shape;
using runtime::Tensor;

void addTrainBenchFlags(CLI::App& c, TrainBenchOptions& o) {
  c.add_option("--model", o.model, "mlp spec")->capture_default_str();
  c.add_option("--threads", o.threads, "BLAS thread counts to measure")->delimiter(',')->capture_default_str();
  c.add_option("--repeats", o.repeats, "runs per thread count (median reported)")->capture_default_str();
  c.add_option("--batch-size", o.batchSize, "batch size")->capture_default_str();
  c.add_option("--samples", o.samples, "training samples per run")->capture_default_str();
}

namespace {

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// The GEMMs one training step of an MLP runs, as (m, n, k, transA, transB).
std::vector<runtime::cpu::GemmOptions> stepGemms(const std::vector<std::pair<int, int>>& layers, int batch) {
  std::vector<runtime::cpu::GemmOptions> g;
  for (size_t i = 0; i < layers.size(); ++i) {
    auto [in, out] = layers[i];
    g.push_back({.m = batch, .n = out, .k = in, .transB = true});      // forward
    g.push_back({.m = out, .n = in, .k = batch, .transA = true});      // weight gradient
    if (i > 0) g.push_back({.m = batch, .n = in, .k = out});           // input gradient
  }
  return g;
}

// Seconds per call of `o`, median of several timed batches of calls.
double timeGemm(const runtime::cpu::GemmOptions& o) {
  Tensor a = Tensor::zeros(Shape{int64_t{o.m} * o.k}), b = Tensor::zeros(Shape{int64_t{o.k} * o.n});
  Tensor c = Tensor::zeros(Shape{int64_t{o.m} * o.n});
  a.fill(0.5f);
  b.fill(0.25f);
  double flops = 2.0 * o.m * o.n * o.k;
  int reps = std::max(1, static_cast<int>(2e8 / flops));
  std::vector<double> t;
  for (int r = 0; r < 7; ++r) {
    auto s = Clock::now();
    for (int i = 0; i < reps; ++i) runtime::cpu::gemm(o, a.data(), b.data(), c.data());
    t.push_back(seconds(s, Clock::now()) / reps);
  }
  return median(t);
}

// One epoch of training; returns samples/s.
double trainOnce(const TrainBenchOptions& o, const runtime::data::Dataset& data, uint64_t seed) {
  auto model = nn::buildModel(o.model);
  model->params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(seed);
  model->net->resetParams(rng);
  auto opt = nn::makeOptimizer({.kind = nn::OptimizerKind::kSgd, .lr = 0.05f, .momentum = 0.9f}, model->params.numel());
  nn::SoftmaxCrossEntropy loss;
  runtime::data::DataLoader loader(data, {.batchSize = o.batchSize, .seed = seed});
  nn::Pass pass;
  pass.needInputGrad = false;
  auto step = [&](const runtime::data::Batch& b) {
    loss.forward(model->net->forward(b.inputs, pass), b.targets);
    model->net->backward(loss.backward(), pass);
    opt->step(model->params.values(), model->params.grads());
  };
  // Warm-up: 20 steps (the peers do the same on a throwaway model).
  loader.startEpoch(1000);
  runtime::data::Batch b;
  for (int i = 0; i < 20 && loader.next(b); ++i) step(b);
  loader.startEpoch(0);
  int64_t done = 0;
  auto start = Clock::now();
  while (done < o.samples && loader.next(b)) {
    step(b);
    done += b.size;
  }
  return static_cast<double>(done) / seconds(start, Clock::now());
}

}  // namespace

int runTrainBench(const TrainBenchOptions& o) {
  if (o.repeats < 1 || o.batchSize < 1 || o.samples < 1) COHORT_THROW(InvalidArgument) << "bench train: counts must be positive";
  auto probe = nn::buildModel(o.model);
  std::vector<std::pair<int, int>> layers;
  for (const auto& e : probe->params.entries()) {
    if (e.shape.rank() == 2) layers.emplace_back(static_cast<int>(e.shape[1]), static_cast<int>(e.shape[0]));
  }
  double flopsPerSample = 0;
  for (size_t i = 0; i < layers.size(); ++i) flopsPerSample += 2.0 * layers[i].first * layers[i].second * (i ? 3 : 2);
  std::printf("# blas: %s\n", runtime::cpu::blasDescription().c_str());

  // The GEMM-only bound at 1 thread: the step's GEMMs timed alone, and a large square SGEMM.
  runtime::cpu::setBlasThreads(1);
  double gemmStep = 0;
  for (const auto& g : stepGemms(layers, static_cast<int>(o.batchSize))) {
    double t = timeGemm(g);
    gemmStep += t;
    std::printf("RESULT bench=sgemm shape=%dx%dx%d trans=%c%c threads=1 gflops=%.1f\n", g.m, g.n, g.k, g.transA ? 'T' : 'N',
                g.transB ? 'T' : 'N', 2.0 * g.m * g.n * g.k / t / 1e9);
  }
  double peak = 2.0 * 1024 * 1024 * 1024 / timeGemm({.m = 1024, .n = 1024, .k = 1024}) / 1e9;
  double gemmOnlySamples = static_cast<double>(o.batchSize) / gemmStep;
  std::printf("RESULT bench=sgemm shape=1024x1024x1024 trans=NN threads=1 gflops=%.1f\n", peak);
  std::printf("RESULT bench=sgemm_step model=%s batch=%lld threads=1 samples_per_s=%.0f\n", o.model.c_str(),
              static_cast<long long>(o.batchSize), gemmOnlySamples);
  std::fflush(stdout);

  auto data = runtime::data::syntheticMnist(runtime::data::Split::kTrain);
  for (int threads : o.threads) {
    runtime::cpu::setBlasThreads(threads);
    std::vector<double> runs;
    for (int r = 0; r < o.repeats; ++r) runs.push_back(trainOnce(o, *data, static_cast<uint64_t>(r)));
    double sps = median(runs);
    double gflops = sps * flopsPerSample / 1e9;
    std::printf("RESULT bench=train model=%s threads=%d samples_per_s=%.0f min=%.0f max=%.0f gflops=%.1f "
                "peak_fraction=%.3f gemm_step_fraction=%.3f\n",
                o.model.c_str(), threads, sps, *std::min_element(runs.begin(), runs.end()),
                *std::max_element(runs.begin(), runs.end()), gflops, gflops / (peak * threads),
                threads == 1 ? sps / gemmOnlySamples : 0.0);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace cohort::bench
