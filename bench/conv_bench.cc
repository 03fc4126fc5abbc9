// conv_bench: how fast the CPU convolution path trains.
//
//   conv_bench [--model cnn:rosetta] [--batch 64] [--iters 20] [--threads 1] [--layers] [--sweep]
//
// Prints the samples/s of whole training steps (forward, cross-entropy, backward, SGD step) of the
// model on random inputs, after two warm-up steps. --layers adds each module's forward and backward
// milliseconds per batch; --sweep times forward + backward of each of cnn:rosetta's convolutions
// alone for several tile sizes (Conv2dOptions::tileColumns), which is how Conv2d's default tiling
// was chosen: each configuration's best wall time over --iters interleaved rounds (neighbours on a
// shared machine only ever slow a run down). The model's figures are wall time, and CPU time of the
// benchmark's thread (steadier on a shared machine, but with several BLAS threads it misses the
// others' work). Errors go to stderr with exit code 2.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "nn/conv2d.h"
#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/cpu/blas.h"
#include "runtime/error.h"

namespace cohort::bench {
namespace {

using Clock = std::chrono::steady_clock;
using nn::Pass;
using runtime::Shape;
using runtime::Tensor;

struct Flags {
  std::string model = "cnn:rosetta";
  int64_t batch = 64;
  int iters = 20;
  int threads = 1;
  bool layers = false;
  bool sweep = false;
};

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// This thread's CPU seconds: on a shared machine it counts only the time the benchmark was running,
// so it varies far less than wall time (it still includes slowdowns from neighbours sharing caches).
double threadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

Tensor uniformTensor(const Shape& shape, uint64_t seed, float lo, float hi) {
  Tensor t = Tensor::empty(shape, runtime::cpuAllocator());
  runtime::Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.at(i) = rng.uniform(lo, hi);
  return t;
}

// Whole training steps of the model, and optionally each module's share.
void benchModel(const Flags& f) {
  auto model = nn::buildModel(f.model);
  model->params.allocate(runtime::cpuAllocator());
  runtime::Rng initRng(1), dropRng(2);
  model->net->resetParams(initRng);
  Shape inShape{f.batch};
  for (int i = 0; i < model->sampleShape.rank(); ++i) inShape.push(model->sampleShape[i]);
  Tensor x = uniformTensor(inShape, 3, 0.0f, 1.0f);
  Tensor y = Tensor::empty(Shape{f.batch}, runtime::cpuAllocator());
  for (int64_t i = 0; i < f.batch; ++i) y.at(i) = static_cast<float>(i % model->outputs);
  auto opt = nn::makeOptimizer({.kind = nn::OptimizerKind::kSgd, .lr = 0.01f, .momentum = 0.9f}, model->params.numel());
  nn::SoftmaxCrossEntropy loss;
  Pass pass;
  pass.rng = &dropRng;
  pass.needInputGrad = false;
  nn::Sequential& net = static_cast<nn::Sequential&>(*model->net);  // buildModel makes Sequentials
  std::vector<double> fwd(net.size()), bwd(net.size());
  auto step = [&](bool timeLayers) {
    if (!timeLayers) {
      loss.forward(net.forward(x, pass), y);
      net.backward(loss.backward(), pass);
    } else {
      // Sequential's loop, one module at a time.
      const Tensor* h = &x;
      for (size_t i = 0; i < net.size(); ++i) {
        double t = threadCpuSeconds();
        h = &net.at(i).forward(*h, pass);
        fwd[i] += threadCpuSeconds() - t;
      }
      loss.forward(*h, y);
      const Tensor* g = &loss.backward();
      for (size_t i = net.size(); i-- > 0;) {
        Pass p = pass;
        p.needInputGrad = i > 0;
        double t = threadCpuSeconds();
        g = &net.at(i).backward(*g, p);
        bwd[i] += threadCpuSeconds() - t;
      }
    }
    opt->step(model->params.values(), model->params.grads());
  };
  for (int i = 0; i < 2; ++i) step(false);
  auto start = Clock::now();
  std::vector<double> cpu;  // per step
  for (int i = 0; i < f.iters; ++i) {
    double t = threadCpuSeconds();
    step(false);
    cpu.push_back(threadCpuSeconds() - t);
  }
  const double seconds = secondsSince(start), batch = static_cast<double>(f.batch);
  double cpuSum = 0;
  for (double c : cpu) cpuSum += c;
  std::sort(cpu.begin(), cpu.end());
  std::printf(
      "%s batch %lld, %d BLAS thread(s), %d steps: %.1f samples/s wall; of CPU time: %.1f mean, %.1f median, "
      "%.1f best step\n",
      f.model.c_str(), static_cast<long long>(f.batch), runtime::cpu::blasThreads(), f.iters, batch * f.iters / seconds,
      batch * f.iters / cpuSum, batch / cpu[cpu.size() / 2], batch / cpu.front());
  if (!f.layers) return;
  for (int i = 0; i < f.iters; ++i) step(true);
  std::printf("%-10s %-42s %10s %10s   (CPU time per batch)\n", "#", "module", "fwd ms", "bwd ms");
  for (size_t i = 0; i < net.size(); ++i) {
    std::printf("%-10zu %-42s %10.2f %10.2f\n", i, net.at(i).name().c_str(), 1e3 * fwd[i] / f.iters,
                1e3 * bwd[i] / f.iters);
  }
}

// Forward + backward (with input gradient) of one convolution for each tile size.
void sweepTiles(const Flags& f) {
  struct Layer {
    const char* name;
    nn::Conv2dOptions options;
    int64_t size;
  };
  const Layer layers[] = {
      {"conv0 3->50 32x32 pad 1", {.in = 3, .out = 50, .kernel = 3, .padding = 1}, 32},
      {"conv1 50->50 32x32", {.in = 50, .out = 50, .kernel = 3}, 32},
      {"conv2 50->100 15x15 pad 1", {.in = 50, .out = 100, .kernel = 3, .padding = 1}, 15},
      {"conv3 100->100 15x15", {.in = 100, .out = 100, .kernel = 3}, 15},
  };
  // Rounds over every configuration, keeping each one's best time: neighbours on a shared machine
  // only ever make a run slower.
  std::vector<std::pair<std::string, nn::Conv2dOptions>> configs;
  std::vector<int64_t> sizes;
  for (const Layer& l : layers) {
    for (int64_t columns : {0, 64, 128, 192, 256, 384, 512, 1024, 4096}) {
      nn::Conv2dOptions o = l.options;
      o.tileColumns = columns;
      configs.emplace_back(std::string(l.name) + (columns ? " tiles " + std::to_string(columns) : " auto"), o);
      sizes.push_back(l.size);
    }
  }
  std::vector<double> best(configs.size(), 1e30);
  for (int round = 0; round < f.iters; ++round) {
    for (size_t k = 0; k < configs.size(); ++k) {
      const nn::Conv2dOptions& o = configs[k].second;
      nn::Conv2d conv(o);
      nn::ParamBuffer params;
      conv.registerParams(params, "");
      params.allocate(runtime::cpuAllocator());
      runtime::Rng rng(1);
      conv.resetParams(rng);
      Tensor x = uniformTensor(Shape{f.batch, o.in, sizes[k], sizes[k]}, 2, -1.0f, 1.0f);
      Tensor dy = uniformTensor(conv.outputShape(x.shape()), 3, -1.0f, 1.0f);
      Pass pass;
      conv.forward(x, pass);  // sizes the buffers
      conv.backward(dy, pass);
      auto start = Clock::now();
      conv.forward(x, pass);
      conv.backward(dy, pass);
      best[k] = std::min(best[k], secondsSince(start));
    }
  }
  std::printf("%-40s %16s\n", "convolution forward + backward", "best wall ms");
  for (size_t k = 0; k < configs.size(); ++k) std::printf("%-40s %16.2f\n", configs[k].first.c_str(), 1e3 * best[k]);
}

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) COHORT_THROW(InvalidArgument) << a << " needs a value";
      return argv[++i];
    };
    if (a == "--model") {
      f.model = value();
    } else if (a == "--batch") {
      f.batch = std::stoll(value());
    } else if (a == "--iters") {
      f.iters = std::stoi(value());
    } else if (a == "--threads") {
      f.threads = std::stoi(value());
    } else if (a == "--layers") {
      f.layers = true;
    } else if (a == "--sweep") {
      f.sweep = true;
    } else {
      COHORT_THROW(InvalidArgument) << "unknown flag " << a
                                    << "; usage: conv_bench [--model SPEC] [--batch N] [--iters N] [--threads N] "
                                       "[--layers] [--sweep]";
    }
  }
  if (f.batch < 1 || f.iters < 1) COHORT_THROW(InvalidArgument) << "--batch and --iters must be positive";
  return f;
}

}  // namespace
}  // namespace cohort::bench

int main(int argc, char** argv) {
  try {
    cohort::bench::Flags f = cohort::bench::parse(argc, argv);
    cohort::runtime::cpu::setBlasThreads(f.threads);
    std::printf("%s\n", cohort::runtime::cpu::blasDescription().c_str());
    if (f.sweep) cohort::bench::sweepTiles(f);
    cohort::bench::benchModel(f);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "conv_bench: %s\n", e.what());
    return 2;
  }
}
