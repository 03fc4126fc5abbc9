// `cohort bench train`: training throughput of a model (default the MLP 784-512-256-10; cnn:lenet,
// cnn:rosetta; batch 64, SGD lr 0.01 momentum 0.9, the peers' synthetic data: MNIST-shaped of
// docs/data.md, or 5000 CIFAR-shaped samples for cnn:rosetta) at each requested BLAS thread count,
// or on a GPU with --device cuda, median of several runs of one epoch each. For an MLP also the
// single-thread SGEMM rate (runtime::cpu::gemm) on the same layer shapes, so the training rate can be read as a
// fraction of what the GEMMs alone could reach.
// Prints one line per figure:
//   RESULT bench=sgemm shape=MxNxK trans=.. threads=1 gflops=..
//   RESULT bench=train model=mlp:784,512,256,10 threads=T samples_per_s=.. gflops=.. sgemm_fraction=..
//   RESULT bench=train model=… device=cuda:0 batch=B conv_algorithms=A samples_per_s=..   (--device cuda)
// A GPT (gpt:…, GPU only) trains with AdamW (lr 3e-3, weight decay 0.01, as bench-peers' gpu_torch.py)
// on windows of random bytes from 16 values, --samples windows (default 30 batches) after 20 warm-up
// steps, and its line adds tokens_per_s. Every figure is the steady state: the warm-up steps, the data
// set's making and the model's start-up are outside the clock, which stops when the stream is done.
// On a GPU each run is the step `cohort train` runs (train::Trainer on a local train::Job:
// bench/train_bench_gpu.cc), its line adds the Job's peak memory and the warm-up's and the timed
// steps' mean losses, and a run whose loss did not fall prints no speed (train::Diverged, exit 6).
// With --mode allreduce (under cohortrun) it measures data-parallel steps instead: bench/overlap_bench.h.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/optimizer.h"
#include "runtime/data/dataset.h"

namespace CLI {
class App;
}

namespace cohort::bench {

struct TrainBenchOptions {
  std::string model = "mlp:784,512,256,10";
  std::string device = "cpu";
  std::vector<int> threads = {1, 2};
  int repeats = 5;
  int64_t batchSize = 64;
  int64_t samples = 0;  // per run; 0: one epoch of the synthetic set (60000 MNIST-shaped, 5000 CIFAR-shaped)
  std::string convAlgorithms = "fastest";  // --device cuda: the cuDNN algorithms allowed (runtime/gpu_options.h)
  std::string precision = "fp32";          // --device cuda: fp32 | bf16 (as cohort train's --precision)
  bool tf32 = false;                       // --device cuda: TF32 for fp32 matrix products
  std::string cudaGraphs = "on";          // --device cuda: on | off, the step's CUDA graph (as cohort train's)
  std::string gemmTuning;                 // --device cuda: on | off (as cohort train's); empty: not given
  // "local" (one process, above) or "allreduce": several ranks, the step time with and without
  // backward overlap (bench/overlap_bench.h).
  std::string mode = "local";
  std::vector<std::string> overlap = {"on", "off"};  // --mode allreduce: the sides measured, in turn
  int zero = 0;  // --mode allreduce: the job's ZeRO stage (train::JobOptions::zero)
  std::string prefetch = "on";  // --zero 3: on | off (train::JobOptions::zeroPrefetch)
  float clipGradNorm = 0;       // --device cuda: as cohort train's --clip-grad-norm
  bool profile = false;         // --device cuda: the timed steps between cudaProfilerStart and Stop
};

void addTrainBenchFlags(CLI::App& command, TrainBenchOptions& options);
int runTrainBench(const TrainBenchOptions& options);

// Shared with bench/overlap_bench.cc: the bench's data for `model` (random byte windows for a GPT,
// at least `samples` of them; the peers' synthetic sets otherwise); InvalidArgument for a model of
// another input shape.
std::unique_ptr<runtime::data::Dataset> benchData(const std::string& model, int64_t samples, int64_t batchSize);
bool isGpt(const std::string& model);
double median(std::vector<double> values);
// The peers' optimizer for `model`: SGD with momentum for the classifiers, AdamW for a GPT.
nn::OptimizerOptions benchOptimizer(const std::string& model);
inline constexpr int kTrainWarmupSteps = 20;  // steps before a run's clock starts
// The --device cuda runs of runTrainBench (bench/train_bench_gpu.cc): `context` tokens a sample.
int runTrainBenchGpu(const TrainBenchOptions& options, const runtime::data::Dataset& data, int64_t context);

}  // namespace cohort::bench
