// `cohort bench train`: training throughput of the MLP 784-512-256-10 (batch 64, SGD momentum 0.9,
// synthetic data; issue 2 §7) at each requested BLAS thread count, median of several runs of one
// epoch each, and the single-thread OpenBLAS SGEMM rate on the same layer shapes, so the training
// rate can be read as a fraction of what the GEMMs alone could reach.
// Prints one line per figure:
//   RESULT bench=sgemm shape=MxNxK trans=.. threads=1 gflops=..
//   RESULT bench=train model=mlp:784,512,256,10 threads=T samples_per_s=.. gflops=.. sgemm_fraction=..
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace cohort::bench {

struct TrainBenchOptions {
  std::string model = "mlp:784,512,256,10";
  std::vector<int> threads = {1, 2};
  int repeats = 5;
  int64_t batchSize = 64;
  int64_t samples = 60000;  // per run (one epoch of the synthetic train set)
};

void addTrainBenchFlags(CLI::App& command, TrainBenchOptions& options);
int runTrainBench(const TrainBenchOptions& options);

}  // namespace cohort::bench
