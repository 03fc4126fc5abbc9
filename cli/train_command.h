// `cohort train`: flags (README.md, "`cohort train`") and the job they describe.
//
// addTrainFlags() declares every flag on a CLI11 subcommand, writing into a TrainFlags the caller
// owns; runTrain() validates them, turns them into the public API's options (train::Job,
// train::Trainer), builds the data, model, optimizer and loss from their specs, runs the Trainer and
// prints the RESULT line on rank 0. Everything that makes the run multi-process is the Job's: cli/
// includes no header of the strategies, segments or communicators (tests/cli/cli_layering_test).
// Errors are thrown as cohort::Error (the main maps them to exit codes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace cohort::cli {

inline constexpr char kDefaultModel[] = "mlp:784,512,256,10";

struct TrainFlags {
  std::string model;     // empty: --init-from's model, else kDefaultModel
  std::string initFrom;  // weights to start from: a Cohort checkpoint, HuggingFace GPT-2 or llm.c model file
  std::string data = "synthetic";
  std::string testData;
  bool augment = false;
  std::string mode = "local";
  std::string backend;
  bool replicas = false;    // allreduce on the CPU: full replicas and gradient all-reduce, not one shared copy per node
  bool noReplicas = false;  // allreduce on the CPU: one shared copy per node (the default on one node)
  std::string device = "cpu";
  int64_t epochs = 1;
  int64_t batchSize = 64;
  double lr = 0.05;
  double momentum = 0.0;
  std::vector<double> betas{0.9, 0.999};  // Adam's (beta1, beta2)
  bool nesterov = false;
  std::string optimizer = "sgd";
  double weightDecay = -1;  // < 0: the optimizer's default (0; 0.01 for adamw)
  std::string loss = "ce";
  int threads = 1;
  uint64_t seed = 0;
  int prefetch = 2;
  std::string checkpoint;
  int64_t checkpointEvery = 0;
  bool resume = false;
  bool resumeOnNewData = false;  // --resume on data other than the checkpoint's: a new epoch order
  int64_t maxSteps = 0;
  std::string metrics;
  bool memoryReport = false;
  std::string lrSchedule = "constant";  // constant | step | cosine
  int64_t accumulateSteps = 1;
  int64_t logEverySteps = 0;            // > 0: a metrics line every N optimizer steps
  double clipGradNorm = 0;              // > 0: clip the gradient to this global L2 norm
  int64_t skipNonFinite = 0;            // non-finite steps to skip before stopping (exit 6)
  double skipSpikes = 0;                // z of the spike rule; 0: off
  int64_t spikesInARow = 10;            // skipped spikes in a row before stopping (exit 6)
  std::string scaleLr = "none";         // none | linear | sqrt: --lr scaled by the effective batch
  int64_t warmupSteps = 0;
  double minLr = 0;
  int64_t decaySteps = 0;  // 0: the run's epochs
  int64_t stepSize = 0;
  double gamma = 0.1;
  double timeout = 300;  // seconds any wait for other workers may take
  double progressEvery = 10;  // seconds between plain progress lines; 0: none
  std::string trace;          // the job's merged trace (Chrome trace / Perfetto JSON)
  std::string tensorboard;    // a directory for rank 0's TensorBoard event file
  std::string plot;           // rank 0 draws the run's metrics here (.png or .svg) when training ends
  int64_t traceSpans = int64_t{1} << 16;
  bool stepReport = false;    // where each epoch's steps spent their time
  int64_t averageEvery = 0;   // hogwild across nodes: steps between averaging rounds; 0: the default (16)
  std::string convAlgorithms;  // --device cuda: fastest | exact; empty: fastest
  std::string precision = "fp32";  // fp32 | bf16 (--device cuda, a model that takes bf16)
  bool tf32 = false;               // --device cuda: TF32 tensor cores for fp32 matrix products
};

void addTrainFlags(CLI::App& command, TrainFlags& flags);
int runTrain(const TrainFlags& flags);

}  // namespace cohort::cli
