// The flags of `cohort train` (docs/cli.md): what they hold, their checks, and the options they make
// for the library (nn::OptimizerOptions, nn::LrScheduleOptions). runTrain (cli/train_command.h) runs them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nn/lr_schedule.h"
#include "nn/model.h"
#include "nn/optimizer.h"
#include "runtime/world_info.h"

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
  // GPT-2's tokenizer (file or folder): the vocabulary of a gpt: spec without vocab=, the samples'
  // encoder and decoder; its digest is recorded in the checkpoint
  std::string tokenizer;
  bool padVocab = false;  // --pad-vocab: that vocabulary padded to a multiple of 128
  bool augment = false;
  std::string mode = "local";
  std::string backend;
  bool replicas = false;    // allreduce on the CPU: full replicas and gradient all-reduce, not one shared copy per node
  bool noReplicas = false;  // allreduce on the CPU: one shared copy per node (the default on one node)
  int zero = 0;                   // --zero: the ZeRO stage (train::JobOptions::zero)
  std::string zeroScope = "job";  // --zero-scope: job | node
  std::string device = "cpu";
  int64_t epochs = 0;  // 0 (not given): 1, or with --max-steps as many as it takes
  int64_t batchSize = 64;
  double lr = 0.05;
  double momentum = 0.0;
  std::vector<double> betas{0.9, 0.999};  // Adam's (beta1, beta2)
  bool nesterov = false;
  std::string optimizer = "sgd";
  double weightDecay = -1;  // < 0: the optimizer's default (0; 0.01 for adamw)
  std::string weightDecayGroups;  // matrices | all; empty: matrices for a gpt (nanoGPT's), all otherwise
  int64_t evalBatchSize = 1000;   // samples per evaluation forward at most (train::TrainerOptions::evalBatchSize)
  std::string loss = "ce";
  int threads = 1;
  uint64_t seed = 0;
  int prefetch = 2;
  std::string checkpoint;
  int64_t checkpointEvery = 0;
  bool resume = false;
  bool resumeOnNewData = false;  // --resume on data other than the checkpoint's: a new epoch order
  bool asyncCheckpoints = false;  // --async-checkpoints (with --zero): shard files written in the background
  int64_t maxSteps = 0;
  std::string metrics;
  bool memoryReport = false;
  std::string lrSchedule = "constant";  // constant | step | cosine
  int64_t accumulateSteps = 1;
  int64_t logEverySteps = 0;            // > 0: a step line (console and metrics) every N optimizer steps
  double peakFlops = 0;                 // the device's peak FLOP/s for the MFU; 0: found out
  int64_t evalEvery = 0;                // > 0: evaluate every N optimizer steps (and at step 0)
  int64_t evalBatches = 0;              // > 0: evaluations cover the test set's first K batches
  int64_t sampleEvery = 0;              // > 0: rank 0 prints a sample every N optimizer steps (GPT)
  int64_t sampleTokens = 32;
  std::string samplePrompt = "<|endoftext|>";
  int64_t stepsPerEpoch = 0;            // > 0: an epoch is N optimizer steps
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
  std::string cudaGraphs = "on";   // --device cuda: on | off, the step's CUDA graph (train/step_graph.h)
  std::string gemmTuning;          // --device cuda: on | off, cuBLASLt's algorithms timed per shape; empty: not given
  std::string recompute = "none";  // none | selective | full: a GPT's activation recompute (nn/recompute.h)
};

void addTrainFlags(CLI::App& command, TrainFlags& flags);
// Refuses (InvalidArgument, naming the flag) what no run could do with these flags in this world.
void validateTrainFlags(const TrainFlags& flags, const runtime::WorldInfo& world);

// --recompute on the model: a GPT's GptOptions::recompute (set before anything runs). The ranks need
// not agree on it, since it changes no bit of the training. InvalidArgument for another model.
void applyRecompute(const TrainFlags& flags, nn::Model& model);

// The CPUs this process may run on (its affinity mask: cohortrun --bind, taskset, a SLURM cgroup).
int allowedCpus();
// The samples one optimizer step of the job averages over, as a multiple of one worker's batch:
// every worker's in allreduce; one worker's in local and Hogwild (each worker applies its own).
int64_t batchFactor(const TrainFlags& flags, const runtime::WorldInfo& world);
// --lr after --scale-lr: the linear rule (Goyal et al.; Horovod's and PyTorch's guides) or its
// square root, from the batch of one worker to the effective batch.
double scaledLr(const TrainFlags& flags, const runtime::WorldInfo& world);
nn::OptimizerOptions optimizerOptions(const TrainFlags& flags, double lr);
// The same with the weight decay's groups for `model` (--weight-decay-groups): nanoGPT's
// nn::decayMatricesOnly (a gpt's default) or none (every parameter decays).
nn::OptimizerOptions optimizerOptions(const TrainFlags& flags, double lr, const nn::Model& model);
// --lr-schedule and its flags; nothing for a constant rate without warmup (the optimizer's own).
std::optional<nn::LrScheduleOptions> lrScheduleOptions(const TrainFlags& flags, double lr);

}  // namespace cohort::cli
