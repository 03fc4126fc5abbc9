#include "bench/train_bench.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "bench/overlap_bench.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/cpu/blas.h"
#include "runtime/data/data_loader.h"
#include "runtime/data/synthetic.h"
#include "runtime/data/text.h"
#include "runtime/device_query.h"
#include "runtime/error.h"
#include "runtime/gpu_options.h"
#include "runtime/random.h"

namespace cohort::bench {

using Clock = std::chrono::steady_clock;
using runtime::Shape;
using runtime::Tensor;

void addTrainBenchFlags(CLI::App& c, TrainBenchOptions& o) {
  c.add_option("--model", o.model, "mlp:… | cnn:lenet | cnn:rosetta | gpt:… (GPU only in --mode local)")
      ->capture_default_str();
  c.add_option("--device", o.device, "cpu | cuda[:N]")->capture_default_str();
  c.add_option("--threads", o.threads, "BLAS thread counts to measure")->delimiter(',')->capture_default_str();
  c.add_option("--repeats", o.repeats, "runs per thread count (median reported)")->capture_default_str();
  c.add_option("--batch-size", o.batchSize, "batch size")->capture_default_str();
  c.add_option("--conv-algorithms", o.convAlgorithms,
               "--device cuda: fastest | exact, the cuDNN algorithms allowed (as cohort train's)")
      ->capture_default_str();
  c.add_option("--precision", o.precision, "--device cuda: fp32 | bf16 (as cohort train's)")->capture_default_str();
  c.add_flag("--tf32", o.tf32, "--device cuda: TF32 tensor cores for fp32 matrix products and convolutions (as cohort train's)");
  c.add_option("--samples", o.samples, "training samples per run (default: 60000 for MNIST-shaped models, 5000 for "
                                       "cnn:rosetta, the peers' figures)");
  c.add_option("--mode", o.mode,
               "local | allreduce (under cohortrun: data-parallel step time with and without "
               "backward overlap)")
      ->capture_default_str();
  c.add_option("--overlap", o.overlap, "--mode allreduce: the sides to measure, in turn (on, off)")
      ->delimiter(',')
      ->capture_default_str();
  c.add_option("--zero", o.zero,
               "--mode allreduce: the ZeRO stage of the job (as cohort train's --zero; bench/compare_zero.sh runs "
               "the stages side by side)")
      ->capture_default_str();
  c.add_option("--prefetch", o.prefetch, "--zero 3: gather the next unit while one computes: on | off")
      ->capture_default_str();
  c.add_option("--clip-grad-norm", o.clipGradNorm, "--device cuda: as cohort train's (0: no clipping)")
      ->capture_default_str();
  c.add_option("--cuda-graphs", o.cudaGraphs,
               "--device cuda: on | off, the whole step captured once as a CUDA graph and replayed "
               "(as cohort train's)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  c.add_option("--gemm-tuning", o.gemmTuning,
               "--device cuda: on (default) | off, cuBLASLt's algorithms timed per product shape (as cohort train's; "
               "without the flag COHORT_GEMM_TUNING decides)")
      ->check(CLI::IsMember({"on", "off"}));
  c.add_flag("--profile", o.profile,
             "--device cuda: the timed steps between cudaProfilerStart and cudaProfilerStop, for nsys or ncu "
             "started with their capture range off (bench/gpu_profile.sh)");
}

bool isGpt(const std::string& model) { return model.rfind("gpt:", 0) == 0; }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

namespace {

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// A GPT's throughput does not depend on which tokens it reads: windows of random bytes (seeded) from
// 16 values, so that the loss has somewhere to fall (bench/train_bench_gpu.cc checks it does), as many
// as `windows` train samples need.
std::unique_ptr<runtime::data::Dataset> randomText(int64_t context, int64_t windows) {
  // The train split is the first 90% of the bytes and holds floor((bytes - 1) / context) windows.
  const int64_t bytes = (windows + 2) * context * 10 / 9 + 4 * (context + 1);
  std::string text(static_cast<size_t>(bytes), '\0');
  runtime::Rng rng(7);
  for (char& c : text) c = static_cast<char>('a' + (rng.nextU64() & 0xf));
  return runtime::data::textDataset(text, "random bytes", {.context = context, .seed = 1}, runtime::data::Split::kTrain);
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

// One epoch of training on the CPU (the peers' optimizer: benchOptimizer; dropout active): samples per second.
double trainOnce(const TrainBenchOptions& o, const runtime::data::Dataset& data, uint64_t seed) {
  auto model = nn::buildModel(o.model);
  model->params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(seed);
  model->net->resetParams(rng);
  auto opt = nn::makeOptimizer(benchOptimizer(o.model), model->params.numel(), nullptr);
  nn::SoftmaxCrossEntropy loss;
  runtime::data::DataLoader loader(data, {.batchSize = o.batchSize, .seed = seed});
  runtime::Rng dropoutRng(seed + 1);
  nn::Pass pass;
  pass.needInputGrad = false;
  pass.rng = &dropoutRng;
  auto step = [&](const runtime::data::Batch& b) {
    loss.forward(model->forward(b.inputs, pass), b.targets);
    model->net->backward(loss.backward(), pass);
    opt->step(model->params.values(), model->params.grads());
  };
  // Warm-up (the peers do the same on a throwaway model).
  loader.startEpoch(1000);
  runtime::data::Batch b;
  for (int i = 0; i < kTrainWarmupSteps && loader.next(b); ++i) step(b);
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

std::unique_ptr<runtime::data::Dataset> benchData(const std::string& model, int64_t samples, int64_t batchSize) {
  auto probe = nn::buildModel(model);
  const bool cifarShaped = probe->sampleShape.numel() == 3 * 32 * 32;
  const int64_t context = probe->sampleShape.numel();
  auto data = isGpt(model)  ? randomText(context, std::max<int64_t>(samples, kTrainWarmupSteps * batchSize))
              : cifarShaped ? runtime::data::syntheticCifar(std::max<int64_t>(samples, batchSize))
                            : runtime::data::syntheticMnist(runtime::data::Split::kTrain);
  if (data->sampleShape().numel() != probe->sampleShape.numel()) {
    COHORT_THROW(InvalidArgument) << "bench train: model " << model << " takes " << probe->sampleShape.numel()
                                  << " inputs; the benchmark has synthetic MNIST- (784) and CIFAR-shaped (3072) data";
  }
  return data;
}

int runTrainBench(const TrainBenchOptions& options) {
  TrainBenchOptions o = options;
  if (o.repeats < 1 || o.batchSize < 1 || o.samples < 0) COHORT_THROW(InvalidArgument) << "bench train: counts must be positive";
  if (o.mode == "allreduce") return runOverlapBench(o);
  if (o.mode != "local")
    COHORT_THROW(InvalidArgument) << "bench train: --mode is local or allreduce, got '" << o.mode << "'";
  runtime::parseConvAlgorithms(o.convAlgorithms);  // an unknown name fails before anything runs
  const runtime::DType precision = runtime::parseDType(o.precision, "--precision");
  const runtime::Device device = runtime::selectDevice(o.device, 0);
  auto probe = nn::buildModel(o.model);
  if ((precision != runtime::DType::kF32 || o.tf32) && !device.isCuda()) {
    COHORT_THROW(InvalidArgument) << "bench train: --precision bf16 and --tf32 apply to --device cuda";
  }
  if ((o.clipGradNorm != 0 || o.profile) && !device.isCuda()) {
    COHORT_THROW(InvalidArgument) << "bench train: --clip-grad-norm and --profile apply to --device cuda";
  }
  if (precision != runtime::DType::kF32 && !probe->net->takesBf16()) {
    COHORT_THROW(InvalidArgument) << "bench train: model " << o.model << " does not implement bf16 passes yet";
  }
  const bool gpt = isGpt(o.model);
  if (gpt && !device.isCuda()) {
    COHORT_THROW(InvalidArgument) << "bench train: a GPT is measured on a GPU here (--device cuda); on the CPU use "
                                     "bench/compare_gpt_peers.sh";
  }
  // Data: the synthetic set the peers use for this input shape; random tokens for a GPT.
  const bool cifarShaped = probe->sampleShape.numel() == 3 * 32 * 32;
  if (o.samples == 0) o.samples = gpt ? 30 * o.batchSize : cifarShaped ? runtime::data::kSyntheticCifarTrainSize : 60000;
  const int64_t context = probe->sampleShape.numel();
  auto data = benchData(o.model, o.samples, o.batchSize);
  if (device.isCuda()) return runTrainBenchGpu(o, *data, context);
  // An MLP's step is all GEMMs: time them alone for the bound (other models get the SGEMM peak only).
  std::vector<std::pair<int, int>> layers;
  bool mlp = o.model.rfind("mlp:", 0) == 0;
  for (const auto& e : probe->params.entries()) {
    if (e.shape.rank() == 2) layers.emplace_back(static_cast<int>(e.shape[1]), static_cast<int>(e.shape[0]));
  }
  double flopsPerSample = 0;
  for (size_t i = 0; i < layers.size(); ++i) flopsPerSample += 2.0 * layers[i].first * layers[i].second * (i ? 3 : 2);
  std::printf("# blas: %s\n", runtime::cpu::blasDescription().c_str());

  runtime::cpu::setBlasThreads(1);
  double gemmStep = 0;
  if (mlp) {
    for (const auto& g : stepGemms(layers, static_cast<int>(o.batchSize))) {
      double t = timeGemm(g);
      gemmStep += t;
      std::printf("RESULT bench=sgemm shape=%dx%dx%d trans=%c%c threads=1 gflops=%.1f\n", g.m, g.n, g.k, g.transA ? 'T' : 'N',
                  g.transB ? 'T' : 'N', 2.0 * g.m * g.n * g.k / t / 1e9);
    }
  }
  double peak = 2.0 * 1024 * 1024 * 1024 / timeGemm({.m = 1024, .n = 1024, .k = 1024}) / 1e9;
  std::printf("RESULT bench=sgemm shape=1024x1024x1024 trans=NN threads=1 gflops=%.1f\n", peak);
  double gemmOnlySamples = mlp ? static_cast<double>(o.batchSize) / gemmStep : 0;
  if (mlp) {
    std::printf("RESULT bench=sgemm_step model=%s batch=%lld threads=1 samples_per_s=%.0f\n", o.model.c_str(),
                static_cast<long long>(o.batchSize), gemmOnlySamples);
  }
  std::fflush(stdout);

  for (int threads : o.threads) {
    runtime::cpu::setBlasThreads(threads);
    std::vector<double> runs;
    for (int r = 0; r < o.repeats; ++r) runs.push_back(trainOnce(o, *data, static_cast<uint64_t>(r)));
    double sps = median(runs);
    std::printf("RESULT bench=train model=%s threads=%d samples_per_s=%.0f min=%.0f max=%.0f", o.model.c_str(), threads, sps,
                *std::min_element(runs.begin(), runs.end()), *std::max_element(runs.begin(), runs.end()));
    if (mlp) {
      double gflops = sps * flopsPerSample / 1e9;
      std::printf(" gflops=%.1f peak_fraction=%.3f gemm_step_fraction=%.3f", gflops, gflops / (peak * threads),
                  threads == 1 ? sps / gemmOnlySamples : 0.0);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace cohort::bench
