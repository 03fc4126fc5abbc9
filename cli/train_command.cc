#include "cli/train_command.h"

#include <CLI/CLI.hpp>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <thread>

#include "cli/cairo_library.h"         // --plot: cairo is there before the run
#include "cli/flag_values.h"           // --seed
#include "cli/memory_estimate.h"       // a floor of what the run needs, before it allocates
#include "cli/plot.h"                  // --plot
#include "nn/checkpoint.h"             // checkOutputFile
#include "nn/loss.h"                   // losses
#include "nn/lr_schedule.h"            // --lr-schedule
#include "nn/model_spec.h"             // --model specs
#include "nn/model_weights.h"          // --init-from
#include "nn/optimizer.h"              // --optimizer
#include "runtime/cpu/blas.h"          // --threads
#include "runtime/data/dataset.h"      // --data specs
#include "runtime/device_query.h"      // formatBytes
#include "runtime/dtype.h"             // --precision
#include "runtime/error.h"
#include "runtime/gpu_options.h"       // --conv-algorithms
#include "runtime/logging.h"
#include "runtime/process_memory.h"    // --memory-report on the CPU
#include "runtime/timeout.h"           // --timeout
#include "runtime/world_info.h"
#include "train/job.h"                 // the job: world, device, placement, collectives
#include "train/trainer.h"             // the training loop

namespace cohort::cli {

namespace data = runtime::data;

void addTrainFlags(CLI::App& c, TrainFlags& f) {
  c.add_option("--model", f.model,
               "model spec: mlp:IN,HIDDEN...,OUT | cnn:lenet | cnn:lenet-bn | cnn:rosetta | gpt:layers=L,heads=H,dim=D,ctx=T[,vocab=V] "
               "(default: --init-from's model, else " + std::string(kDefaultModel) + ")");
  c.add_option("--init-from", f.initFrom,
               "start from these weights (the optimizer starts fresh): a Cohort checkpoint, a HuggingFace GPT-2 "
               "(model.safetensors or its directory) or an llm.c model file (gpt2_124M.bin); --model, if given, must fit them");
  c.add_option("--data", f.data, "training data: synthetic | synthetic-cifar[:N] | mnist:DIR | cifar10:DIR | csv:FILE")
      ->capture_default_str();
  c.add_flag("--augment", f.augment, "random crop (padding 4) and horizontal flip of image samples [C,H,W] while training");
  c.add_option("--test-data", f.testData, "test data (default: the test split of --data; none for csv)");
  c.add_option("--mode", f.mode, "local | hogwild | allreduce")->capture_default_str();
  c.add_option("--backend", f.backend, "all-reduce backend: shm | mpi | nccl");
  c.add_flag("--replicas", f.replicas,
             "--mode allreduce on the CPU: a full replica per worker and bucketed gradient all-reduce, instead of "
             "one shared parameter copy per node that each worker updates a shard of (the default across nodes)");
  c.add_flag("--no-replicas", f.noReplicas,
             "--mode allreduce on the CPU: one shared parameter copy per node, each worker updating a shard of it "
             "(the default on one node; across nodes over --backend hierarchical, the default there)");
  c.add_option("--device", f.device, "cpu | cuda[:N]")->capture_default_str();
  c.add_option("--epochs", f.epochs, "epochs to train")->capture_default_str();
  c.add_option("--batch-size", f.batchSize, "samples per step and worker")->capture_default_str();
  c.add_option("--lr", f.lr, "learning rate")->capture_default_str();
  c.add_option("--momentum", f.momentum, "SGD momentum")->capture_default_str();
  c.add_flag("--nesterov", f.nesterov, "Nesterov momentum (SGD)");
  c.add_option("--betas", f.betas, "adam, adamw: the moment decay rates B1,B2 (PyTorch's betas)")
      ->delimiter(',')
      ->expected(2)
      ->capture_default_str();
  c.add_option("--lr-schedule", f.lrSchedule,
               "constant | step | cosine: the learning rate of each optimizer step (PyTorch's StepLR, CosineAnnealingLR)")
      ->capture_default_str();
  c.add_option("--accumulate-steps", f.accumulateSteps,
               "micro-batches of --batch-size per optimizer step: gradients summed and averaged, only the last "
               "all-reduced (DDP's no_sync); the epoch's samples and order are unchanged")
      ->capture_default_str();
  c.add_option("--clip-grad-norm", f.clipGradNorm,
               "clip each step's gradient to this global L2 norm (PyTorch's clip_grad_norm_; in allreduce the "
               "averaged gradient's); 0: no clipping")
      ->capture_default_str();
  c.add_option("--skip-nonfinite", f.skipNonFinite,
               "skip up to N steps whose loss or gradient is non-finite (counted, reported); by default the first "
               "such step stops the run with exit code 6")
      ->capture_default_str();
  c.add_option("--skip-spikes", f.skipSpikes,
               "skip a step whose loss (CPU) or gradient norm lies more than Z standard deviations above the mean of "
               "the last 128 applied steps (judged once 16 were; llm.c's outlier rule): logged, counted as "
               "skipped_spikes; 0: off")
      ->capture_default_str();
  c.add_option("--spikes-in-a-row", f.spikesInARow,
               "--skip-spikes: the most spikes skipped in a row; the next stops the run with exit code 6")
      ->capture_default_str();
  c.add_option("--scale-lr", f.scaleLr,
               "none | linear | sqrt: in allreduce, multiply --lr by the workers (linear) or its square root: the "
               "effective batch is workers x --batch-size (docs/api.md, 'The effective batch')")
      ->capture_default_str();
  c.add_option("--warmup-steps", f.warmupSteps, "optimizer steps of linear warmup from 0 before the schedule")
      ->capture_default_str();
  c.add_option("--min-lr", f.minLr, "cosine: the learning rate at the last step")->capture_default_str();
  c.add_option("--decay-steps", f.decaySteps,
               "cosine: the optimizer step (warmup included) at which the rate reaches --min-lr and stays "
               "(nanoGPT's lr_decay_iters; default: the last step of --epochs)");
  c.add_option("--step-size", f.stepSize, "step: optimizer steps between decays");
  c.add_option("--gamma", f.gamma, "step: the decay factor")->capture_default_str();
  c.add_option("--optimizer", f.optimizer, "sgd | adam | adamw")->capture_default_str();
  c.add_option("--weight-decay", f.weightDecay, "L2 penalty (sgd, adam) or decoupled decay (adamw; default 0.01)");
  c.add_option("--loss", f.loss, "ce (softmax cross-entropy) | mse")->capture_default_str();
  c.add_option("--threads", f.threads, "BLAS threads per worker")->capture_default_str();
  addSeedOption(c, f.seed, "seed for initialisation, shuffling and dropout (0 to 2^64-1)");
  c.add_option("--prefetch", f.prefetch,
               "batches the data loader gathers ahead (capped at the batches per epoch and 256 MiB of batches)")
      ->capture_default_str();
  c.add_option("--checkpoint", f.checkpoint, "checkpoint file (safetensors), written every epoch");
  c.add_option("--checkpoint-every", f.checkpointEvery, "also write a checkpoint every N steps");
  c.add_flag("--resume", f.resume, "continue from --checkpoint if it exists");
  c.add_flag("--resume-on-new-data", f.resumeOnNewData,
             "with --resume: accept training data other than the checkpoint's (refused otherwise), keeping the "
             "weights, optimizer state and step count, and start the checkpoint's epoch afresh on it (a new order)");
  c.add_option("--max-steps", f.maxSteps, "stop after N optimizer steps in all (a checkpoint is written)");
  c.add_option("--metrics", f.metrics, "append one JSON line per epoch to this file");
  c.add_option("--log-every-steps", f.logEverySteps,
               "also append a metrics line every N optimizer steps (rank 0's loss, learning rate and samples/s)");
  c.add_option("--progress-every", f.progressEvery,
               "rank 0's progress within an epoch: on a terminal one line rewritten in place; otherwise a line every S "
               "seconds (0: none)")
      ->capture_default_str();
  c.add_option("--tensorboard", f.tensorboard,
               "write the metrics as TensorBoard scalars into a new event file in this directory (tensorboard --logdir DIR)");
  c.add_option("--plot", f.plot,
               "when training ends, draw loss and accuracy from the metrics into this .png or .svg (rank 0; see cohort plot)");
  c.add_option("--trace", f.trace,
               "record every rank's spans (data, forward, backward, all-reduce, optimizer, barriers, evaluation, "
               "checkpoints) and write one Chrome trace / Perfetto JSON file of the job here at the end");
  c.add_option("--trace-spans", f.traceSpans, "spans each rank keeps for --trace (the newest; 24 bytes each)")
      ->capture_default_str();
  c.add_flag("--step-report", f.stepReport,
             "at each epoch's end, where the steps spent their time and which rank is slowest (on with --trace)");
  c.add_flag("--memory-report", f.memoryReport,
             "print the memory the run used at the end (GPU: the caching allocator's allocated, reserved and peak bytes)");
  c.add_option("--average-every", f.averageEvery,
               "--mode hogwild across nodes: each node's first worker averages the node's parameter copy with the "
               "other nodes' every N of its steps, overlapped with training (and fully at every epoch's end); 0: the "
               "default, 16");
  c.add_option("--conv-algorithms", f.convAlgorithms,
               "--device cuda: fastest (default; the fastest cuDNN algorithm measured per layer shape, Winograd and "
               "FFT included, about 1e-3 from fp32 accumulation) | exact (only algorithms that match plain fp32 "
               "accumulation; docs/gpu.md)");
  c.add_option("--precision", f.precision,
               "fp32 (default) | bf16: --device cuda, matrix products in bf16 on tensor cores with fp32 sums and fp32 "
               "master weights, optimizer state and checkpoints (docs/gpu.md, \"Precision\", lists the models)")
      ->capture_default_str();
  c.add_flag("--tf32", f.tf32,
             "--device cuda: let fp32 matrix products and convolutions use TF32 tensor cores (inputs rounded to 10 "
             "bits of mantissa); "
             "off by default, so plain fp32 stays comparable to the CPU");
  c.add_option("--timeout", f.timeout, "seconds to wait for other workers (start-up, barriers, collectives) before failing; huge values and inf "
                 "wait about 100 years")
      ->capture_default_str();
}

namespace {

// More BLAS threads than any machine we run on has cores: a typo, not a setting.
constexpr int kMaxThreads = 1024;
constexpr int64_t kMaxAccumulateSteps = int64_t{1} << 20;  // with 2^40 samples a batch: no product overflows

// The CPUs this process may run on (its affinity mask: cohortrun --bind, taskset, a SLURM cgroup).
int allowedCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return static_cast<int>(std::thread::hardware_concurrency());
  return CPU_COUNT(&set);
}

void validate(const TrainFlags& f, const runtime::WorldInfo& world) {
  if (f.mode != "local" && f.mode != "hogwild" && f.mode != "allreduce") {
    COHORT_THROW(InvalidArgument) << "unknown --mode '" << f.mode << "': expected local, hogwild or allreduce";
  }
  if (f.mode == "local" && !world.isSingle()) {
    COHORT_THROW(InvalidArgument) << "--mode local trains in one process, but this process is rank " << world.rank << " of "
                                  << world.worldSize << " (from " << world.source
                                  << " variables): use --mode allreduce or --mode hogwild";
  }
  if (f.averageEvery < 0) COHORT_THROW(InvalidArgument) << "--average-every must be >= 0 steps (0: the default, 16), got " << f.averageEvery;
  if (f.averageEvery > 0 && f.mode != "hogwild") COHORT_THROW(InvalidArgument) << "--average-every applies to --mode hogwild only";
  if (f.mode == "hogwild") {
    if (f.checkpointEvery > 0 || f.maxSteps > 0) {
      COHORT_THROW(InvalidArgument) << (f.maxSteps > 0 ? "--max-steps" : "--checkpoint-every")
                                    << " needs workers that step together (--mode local or allreduce): Hogwild workers "
                                       "meet (and checkpoint) only at the end of each epoch";
    }
  }
  runtime::timeoutFromSeconds(f.timeout, "--timeout");  // refuses <= 0 and NaN; saturates huge values
  if (!f.backend.empty() && f.mode != "allreduce") COHORT_THROW(InvalidArgument) << "--backend applies to --mode allreduce only";
  const char* replicasFlag = f.replicas ? "--replicas" : "--no-replicas";
  if (f.replicas && f.noReplicas) COHORT_THROW(InvalidArgument) << "--replicas and --no-replicas contradict each other: give one";
  if ((f.replicas || f.noReplicas) && f.mode != "allreduce") {
    COHORT_THROW(InvalidArgument) << replicasFlag << " applies to --mode allreduce only";
  }
  if (f.noReplicas && f.backend == "mpi") {
    COHORT_THROW(InvalidArgument) << "--no-replicas (one shared parameter copy per node) needs --backend shm on one node "
                                     "or hierarchical across nodes, not mpi";
  }
  const bool onGpu = runtime::Device::parse(f.device).isCuda();
  if (onGpu && f.mode == "allreduce" && !f.backend.empty() && f.backend != "nccl") {
    COHORT_THROW(InvalidArgument) << "--backend " << f.backend << " all-reduces CPU memory; with --device " << f.device
                                  << " use --backend nccl (the default on a GPU)";
  }
  if (!onGpu && f.backend == "nccl") {
    COHORT_THROW(InvalidArgument) << "--backend nccl all-reduces GPU memory: add --device cuda (or use shm or mpi)";
  }
  if (!f.convAlgorithms.empty() && f.convAlgorithms != "fastest" && f.convAlgorithms != "exact") {
    COHORT_THROW(InvalidArgument) << "unknown --conv-algorithms '" << f.convAlgorithms << "': expected fastest or exact";
  }
  if (!f.convAlgorithms.empty() && !onGpu) {
    COHORT_THROW(InvalidArgument) << "--conv-algorithms applies to --device cuda (on the CPU convolutions are im2col "
                                     "and GEMM, always fp32 accumulation)";
  }
  const runtime::DType precision = runtime::parseDType(f.precision, "--precision");
  if (precision != runtime::DType::kF32 && !onGpu) {
    COHORT_THROW(InvalidArgument) << "--precision " << f.precision << " needs --device cuda (on the CPU every pass computes "
                                  << "in fp32)";
  }
  if (f.tf32 && !onGpu) {
    COHORT_THROW(InvalidArgument) << "--tf32 applies to --device cuda (the CPU's matrix products are plain fp32)";
  }
  if (onGpu && (f.replicas || f.noReplicas)) {
    COHORT_THROW(InvalidArgument) << replicasFlag << " applies to CPU training (GPU all-reduce always replicates)";
  }
  if (f.threads < 1 || f.threads > kMaxThreads) {
    COHORT_THROW(InvalidArgument) << "--threads must be 1.." << kMaxThreads << " BLAS threads per worker, got " << f.threads;
  }
  if (f.epochs <= 0) COHORT_THROW(InvalidArgument) << "--epochs must be positive, got " << f.epochs;
  if (f.batchSize <= 0) COHORT_THROW(InvalidArgument) << "--batch-size must be positive, got " << f.batchSize;
  if (f.batchSize > data::kMaxBatchSize) {
    COHORT_THROW(InvalidArgument) << "--batch-size " << f.batchSize << " is above the largest supported, " << data::kMaxBatchSize
                                  << " (2^40); a batch as large as the data set takes all of it";
  }
  if (f.logEverySteps < 0) COHORT_THROW(InvalidArgument) << "--log-every-steps must be >= 0, got " << f.logEverySteps;
  if (f.accumulateSteps < 1 || f.accumulateSteps > kMaxAccumulateSteps) {
    COHORT_THROW(InvalidArgument) << "--accumulate-steps must be 1.." << kMaxAccumulateSteps << ", got " << f.accumulateSteps;
  }
  if (f.prefetch < 0) COHORT_THROW(InvalidArgument) << "--prefetch must be >= 0, got " << f.prefetch;
  if (!(f.clipGradNorm >= 0) || !std::isfinite(f.clipGradNorm) || f.clipGradNorm > std::numeric_limits<float>::max()) {
    COHORT_THROW(InvalidArgument) << "--clip-grad-norm must be a finite number >= 0 (0: no clipping), got " << f.clipGradNorm;
  }
  if (f.skipNonFinite < 0) COHORT_THROW(InvalidArgument) << "--skip-nonfinite must be >= 0, got " << f.skipNonFinite;
  if (!(f.skipSpikes >= 0) || !std::isfinite(f.skipSpikes)) {
    COHORT_THROW(InvalidArgument) << "--skip-spikes must be a finite number of standard deviations >= 0 (0: off), got "
                                  << f.skipSpikes;
  }
  if (f.spikesInARow < 0) COHORT_THROW(InvalidArgument) << "--spikes-in-a-row must be >= 0, got " << f.spikesInARow;
  if (!(f.progressEvery >= 0) || !std::isfinite(f.progressEvery)) {
    COHORT_THROW(InvalidArgument) << "--progress-every must be a number of seconds >= 0 (0: none), got " << f.progressEvery;
  }
  if (!f.plot.empty()) {
    std::string ext = f.plot.size() >= 4 ? f.plot.substr(f.plot.size() - 4) : "";
    for (char& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (ext != ".png" && ext != ".svg") {
      COHORT_THROW(InvalidArgument) << "--plot " << f.plot << ": the image must end in .png or .svg";
    }
  }
  if (f.traceSpans < 1) COHORT_THROW(InvalidArgument) << "--trace-spans must be at least 1, got " << f.traceSpans;
  if (f.maxSteps < 0) COHORT_THROW(InvalidArgument) << "--max-steps must be >= 0";
  if (f.checkpointEvery < 0) COHORT_THROW(InvalidArgument) << "--checkpoint-every must be >= 0";
  if (f.resumeOnNewData && !f.resume) COHORT_THROW(InvalidArgument) << "--resume-on-new-data needs --resume";
  if ((f.resume || f.checkpointEvery > 0) && f.checkpoint.empty()) {
    COHORT_THROW(InvalidArgument) << (f.resume ? "--resume" : "--checkpoint-every") << " needs --checkpoint PATH";
  }
  if (f.loss != "ce" && f.loss != "mse") COHORT_THROW(InvalidArgument) << "unknown --loss '" << f.loss << "': expected ce or mse";
}

std::unique_ptr<data::Dataset> openTestSet(const TrainFlags& f, const data::DatasetHints& hints) {
  if (!f.testData.empty()) {
    bool csv = f.testData.rfind("csv:", 0) == 0;
    return data::openDataset(f.testData, csv ? data::Split::kTrain : data::Split::kTest, hints);
  }
  // Neither a CSV file nor token shards have a test split of their own (llm.c's and nanoGPT's
  // corpora come with validation shards): without --test-data, no test set.
  if (f.data.rfind("csv:", 0) == 0 || f.data.rfind("tokens:", 0) == 0) return nullptr;
  return data::openDataset(f.data, data::Split::kTest, hints);
}

void checkFits(const nn::Model& model, const data::Dataset& d, bool classification) {
  if (d.sampleShape().numel() != model.sampleShape.numel()) {
    COHORT_THROW(InvalidArgument) << "model " << model.name << " takes " << model.sampleShape.numel()
                                  << " input features, but " << d.name() << " has " << d.sampleShape().numel();
  }
  if (classification && d.numClasses() == 0) {
    COHORT_THROW(InvalidArgument) << d.name() << " has targets that are not class indices: use --loss mse for regression";
  }
  if (classification && d.numClasses() > model.outputs) {
    COHORT_THROW(InvalidArgument) << d.name() << " has " << d.numClasses() << " classes, but model " << model.name
                                  << " has " << model.outputs << " outputs";
  }
  if (!classification && d.targetShape().numel() != model.outputs) {
    COHORT_THROW(InvalidArgument) << d.name() << " has " << d.targetShape().numel() << " target values per sample, but model "
                                  << model.name << " has " << model.outputs << " outputs";
  }
}

}  // namespace

namespace {

// The samples one optimizer step of the job averages over, as a multiple of one worker's batch:
// every worker's in allreduce; one worker's in local and Hogwild (each worker applies its own).
int64_t batchFactor(const TrainFlags& f, const runtime::WorldInfo& world) {
  return (f.mode == "allreduce" ? world.worldSize : 1) * f.accumulateSteps;
}

// --lr after --scale-lr: the linear rule (Goyal et al.; Horovod's and PyTorch's guides) or its
// square root, from the batch of one worker to the effective batch.
double scaledLr(const TrainFlags& f, const runtime::WorldInfo& world) {
  const double k = static_cast<double>(batchFactor(f, world));
  if (f.scaleLr == "none") return f.lr;
  if (f.scaleLr == "linear") return f.lr * k;
  if (f.scaleLr == "sqrt") return f.lr * std::sqrt(k);
  COHORT_THROW(InvalidArgument) << "unknown --scale-lr '" << f.scaleLr << "': expected none, linear or sqrt";
}

nn::OptimizerOptions optimizerOptions(const TrainFlags& f, double lr) {
  nn::OptimizerOptions opt;
  opt.kind = nn::parseOptimizerKind(f.optimizer);
  opt.lr = static_cast<float>(lr);
  opt.momentum = static_cast<float>(f.momentum);
  opt.nesterov = f.nesterov;
  opt.beta1 = static_cast<float>(f.betas[0]);
  opt.beta2 = static_cast<float>(f.betas[1]);
  opt.weightDecay = static_cast<float>(f.weightDecay >= 0 ? f.weightDecay : opt.kind == nn::OptimizerKind::kAdamW ? 0.01 : 0.0);
  return opt;
}

// --lr-schedule and its flags; nothing for a constant rate without warmup (the optimizer's own).
std::optional<nn::LrScheduleOptions> lrScheduleOptions(const TrainFlags& f, double lr) {
  const nn::LrScheduleKind kind = nn::parseLrScheduleKind(f.lrSchedule);
  if (f.decaySteps < 0) COHORT_THROW(InvalidArgument) << "--decay-steps must be > 0, got " << f.decaySteps;
  if (f.decaySteps > 0 && kind != nn::LrScheduleKind::kCosine) {
    COHORT_THROW(InvalidArgument) << "--decay-steps is for --lr-schedule cosine, not " << f.lrSchedule;
  }
  if (kind == nn::LrScheduleKind::kConstant && f.warmupSteps == 0) return std::nullopt;
  return nn::LrScheduleOptions{.kind = kind,
                               .baseLr = lr,
                               .warmupSteps = f.warmupSteps,
                               .totalSteps = f.decaySteps,
                               .minLr = f.minLr,
                               .stepSize = f.stepSize,
                               .gamma = f.gamma};
}

// One line on what a step of the job averages over, and what that means for the learning rate
// (8 workers at one worker's --lr trained to 0.29 where one worker reached 0.75, with nothing saying why).
void reportEffectiveBatch(const runtime::Logger& log, const TrainFlags& f, const runtime::WorldInfo& world, double lr) {
  if (world.isSingle() && f.accumulateSteps == 1) return;
  const std::string micro = f.accumulateSteps > 1 ? " x " + std::to_string(f.accumulateSteps) + " micro-batches" : "";
  if (f.mode == "hogwild") {
    log.info() << "each of the " << world.worldSize << " Hogwild workers applies its own steps of batch "
               << f.batchSize * f.accumulateSteps << " (" << f.batchSize << micro << ")"
               << (f.scaleLr != "none" ? ", --lr scaled to " + std::to_string(lr) : std::string());
    return;
  }
  const int64_t workers = f.mode == "allreduce" ? world.worldSize : 1;
  auto line = log.info();
  line << "effective batch " << batchFactor(f, world) * f.batchSize << " (" << workers
       << (workers == 1 ? " worker x " : " workers x ") << f.batchSize << micro << ")";
  if (f.scaleLr != "none") {
    line << ": --lr " << f.lr << " scaled " << (f.scaleLr == "linear" ? "linearly" : "by the square root") << " to " << lr;
  } else {
    line << ": one worker's --lr; for the same progress per sample consider --scale-lr linear with --warmup-steps";
  }
}

// SIGUSR1 (SLURM sends it before the time limit with --signal=USR1@SECONDS; cohortrun forwards it),
// SIGTERM (cohortrun's stop, a scheduler's, `kill`) and SIGHUP (the terminal closed) ask the training
// loop to checkpoint and stop cleanly, as docs/launcher.md says workers do. A second SIGTERM or
// SIGHUP ends the worker at once (exit 128 + the signal): a worker stuck where the loop cannot see
// the request still leaves when asked twice. After a stop on SIGTERM or SIGHUP the worker exits
// 128 + that signal (so a shell or scheduler sees it was stopped), after one on SIGUSR1 with 0
// (SLURM requeues on the RESULT line's stopped=signal). The flags are the program's globals; only
// the program (never the library) has them.
//
// Before the Trainer stands (gTrainingReady: the data opened, the ranks met, their settings agreed)
// there is nothing to checkpoint and the loop that would see a request has not started: a rank
// waiting there for peers that never come would sit out the whole --timeout (issue 44, item 17).
// There SIGTERM and SIGHUP end the worker at once with 128 + the signal, as their default action
// would, leaving what a killed worker leaves (its roster slot names it as gone to its peers; names
// in shared memory are removed by cohortrun's sweep or the next job of the id). SIGUSR1 still asks
// the loop to stop at its first step.
//
// The signals are never delivered to a training thread: they are blocked before any thread exists
// (every thread inherits the mask) and taken by one thread of its own with sigwait(). A handler
// running on a training thread's stack corrupted the heap: Debian's oneDNN 2.6 sgemm kernels keep
// data below the stack pointer, beyond the red zone, where the kernel writes the signal frame (seen
// as "corrupted size vs. prev_size" aborts and SIGSEGVs in cli_allreduce_test's SIGUSR1 case;
// valgrind shows oneDNN reading below its stack pointer).
std::atomic<bool> gStopRequested{false};
std::atomic<int> gStopSignal{0};  // the signal that asked to stop (the last one)
std::atomic<int> gTerminatingSignal{0};  // SIGTERM or SIGHUP, once one has asked
std::atomic<bool> gTrainingReady{false};  // the Trainer is made: a stop request is honoured
// Hogwild across nodes: the workers meet only at an epoch's end (train::Trainer::stopVoteDue), so a
// stop is honoured there, and the answer to the signal says so.
std::atomic<bool> gStopsAtEpochEnd{false};

void installStopSignal() {
  sigset_t set;
  sigemptyset(&set);
  for (int signal : {SIGUSR1, SIGTERM, SIGHUP}) sigaddset(&set, signal);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int signal = 0;
    while (sigwait(&set, &signal) == 0) {
      if (signal != SIGUSR1) {
        const char* name = signal == SIGTERM ? "SIGTERM" : "SIGHUP";
        if (!gTrainingReady.load()) {
          std::fprintf(stderr, "cohort: %s before training began: leaving now (exit %d)\n", name, 128 + signal);
          std::_Exit(128 + signal);
        }
        if (gTerminatingSignal.exchange(signal) != 0) {
          std::fprintf(stderr, "cohort: %s again: leaving now, without a checkpoint\n", name);
          std::_Exit(128 + signal);
        }
        std::fprintf(stderr, "cohort: %s: stopping %s (with a checkpoint where --checkpoint is given); "
                             "send it again to leave at once\n",
                     name, gStopsAtEpochEnd.load() ? "at the end of this epoch (Hogwild workers across nodes meet only there)"
                                                   : "after this step");
      }
      gStopSignal.store(signal, std::memory_order_relaxed);
      gStopRequested.store(true, std::memory_order_relaxed);
    }
  }).detach();
}

// --memory-report: what the run held, in the terms of torch.cuda.memory_allocated/_reserved and
// max_memory_allocated on a GPU; on the CPU the process's peak resident size and what is resident
// now, by kind (runtime/process_memory.h): the private part is what each further worker costs.
void reportMemory(const runtime::Logger& log, const runtime::Device& device,
                  const std::optional<runtime::AllocatorStats>& gpu) {
  if (gpu) {
    log.info() << "memory report (" << device.str() << " caching allocator): allocated "
               << runtime::formatBytes(gpu->allocatedBytes) << ", reserved " << runtime::formatBytes(gpu->reservedBytes)
               << ", peak allocated " << runtime::formatBytes(gpu->peakAllocatedBytes) << ", peak reserved "
               << runtime::formatBytes(gpu->peakReservedBytes) << ", " << gpu->allocationCount << " allocations ("
               << gpu->systemAllocations << " from the driver)";
    return;
  }
  const runtime::ProcessMemory m = runtime::processMemory();
  log.info() << "memory report (cpu): peak resident " << runtime::formatBytes(m.peakResidentBytes) << "; resident now "
             << runtime::formatBytes(m.residentBytes) << ": " << runtime::formatBytes(m.anonymousBytes)
             << " private (heap, stacks, data), " << runtime::formatBytes(m.fileBytes)
             << " file-backed (program and libraries), " << runtime::formatBytes(m.sharedMemoryBytes) << " shared memory";
}

// --model, else the model of --init-from's weights, else the default.
std::string modelSpec(const TrainFlags& f, const nn::ModelWeights* init) {
  if (!f.model.empty()) return f.model;
  if (!init) return kDefaultModel;
  if (init->spec.empty()) {
    COHORT_THROW(InvalidArgument) << f.initFrom << " (" << init->format << ") does not say how many heads its GPT has (no "
                                  << "config.json beside it, and its width is no multiple of 64): give --model gpt:...";
  }
  return init->spec;
}

// The RESULT line (README.md, "`cohort train`").
// tokensPerSample: a language model's context (its losses are per token), else 1.
std::string resultLine(const train::Job& job, const train::TrainResult& r, bool classification, int64_t tokensPerSample) {
  std::ostringstream os;
  os << "RESULT mode=" << train::toString(job.options().mode) << " backend=" << job.backend()
     << " world_size=" << job.world().worldSize << " epochs=" << r.epochs << " train_loss=" << r.trainLoss;
  if (r.haveTest) os << " test_loss=" << r.testLoss;
  if (r.haveTest && tokensPerSample > 1) os << " test_ppl=" << std::exp(r.testLoss);
  if (r.haveTest && classification) os << " test_acc=" << r.testAcc;
  os << " samples_per_s=" << static_cast<int64_t>(r.samplesPerSec);
  if (tokensPerSample > 1) os << " tokens_per_s=" << static_cast<int64_t>(r.samplesPerSec * static_cast<double>(tokensPerSample));
  os << " wall_s=" << r.wallSeconds;
  // Only on a run that ended before its last epoch, so scripts can tell it from a finished one.
  if (r.stopReason != train::StopReason::kNone) os << " stopped=" << train::toString(r.stopReason);
  if (r.skippedSteps > 0) os << " skipped_steps=" << r.skippedSteps;
  if (r.skippedSpikes > 0) os << " skipped_spikes=" << r.skippedSpikes;
  return os.str();
}

}  // namespace

int runTrain(const TrainFlags& f) {
  // First thing: a SIGUSR1 during set-up (a job started close to its time limit) must not kill the
  // worker; the loop sees the request at its first step.
  installStopSignal();
  const runtime::WorldInfo world = runtime::WorldInfo::detect();
  validate(f, world);
  runtime::Logger log(world, {.fd = 1});
  if (!world.isSingle()) {
    char host[256] = "?";
    ::gethostname(host, sizeof host - 1);
    log.info() << "rank " << world.rank << " of " << world.worldSize << " (local " << world.localRank << " of "
               << world.localWorldSize << ") on " << host << " from " << world.source << " variables, job " << world.jobId
               << (world.restartCount ? ", restart " + std::to_string(world.restartCount) : std::string());
  }
  runtime::cpu::setBlasThreads(f.threads);
  if (f.threads > allowedCpus() && !f.device.starts_with("cuda")) {
    log.warn() << "--threads " << f.threads << " is more than the " << allowedCpus()
               << " CPU(s) this worker may use: the BLAS threads will take turns (slower, not faster)";
  }
  // Every output path is checked before anything runs, the same way (nn::checkOutputFile): the
  // Trainer checks --checkpoint, --metrics, --trace and --tensorboard on rank 0, this the image.
  if (!f.plot.empty() && world.rank == 0) {
    nn::checkOutputFile(f.plot, "the plot");
    CairoLibrary{};  // a missing cairo fails here (exit 2), not after the run
  }
  const bool classification = f.loss == "ce";
  train::Job job({.mode = train::parseMode(f.mode),
                  .backend = f.backend,
                  .replicas = f.replicas || f.noReplicas ? std::optional<bool>(f.replicas) : std::nullopt,
                  .device = f.device,
                  .timeout = runtime::timeoutFromSeconds(f.timeout, "--timeout"),
                  .averageEvery = f.averageEvery,
                  .convAlgorithms = runtime::parseConvAlgorithms(f.convAlgorithms.empty() ? "fastest" : f.convAlgorithms),
                  .tf32 = f.tf32,
                  .precision = runtime::parseDType(f.precision, "--precision")},
                 world);

  std::optional<nn::ModelWeights> init;
  if (!f.initFrom.empty()) init = nn::readModelWeights(f.initFrom);
  const std::string spec = modelSpec(f, init ? &*init : nullptr);
  std::unique_ptr<nn::Model> model = nn::buildModel(spec);
  if (init) nn::checkWeightsFit(*model, *init);
  const double lr = scaledLr(f, world);
  const data::DatasetHints hints = train::datasetHints(*model, f.seed);
  std::unique_ptr<data::Dataset> trainSet = data::openDataset(f.data, data::Split::kTrain, hints);
  // Every rank holds the test set: the ranks evaluate a share each (Trainer::evaluateTest).
  std::unique_ptr<data::Dataset> testSet = openTestSet(f, hints);
  checkFits(*model, *trainSet, classification);
  if (testSet) checkFits(*model, *testSet, classification);
  // Before the optimizer's state or the parameters are allocated.
  checkMemoryEstimate({.model = *model, .optimizer = optimizerOptions(f, lr), .data = *trainSet, .batchSize = f.batchSize,
                       .context = hints.context, .onGpu = job.device().isCuda()},
                      world, log);
  auto optimizer = nn::makeOptimizer(optimizerOptions(f, lr), model->params.numel(), job.gpu());
  job.place(*model, *optimizer,
            {.seed = f.seed,
             .initialise = init ? std::function<void(nn::Model&)>([&](nn::Model& m) { nn::copyWeights(m, *init); }) : nullptr,
             .settings = {{"loss", f.loss}, {"init_from", f.initFrom}}});
  if (init) {
    log.info() << "started from " << f.initFrom << " (" << init->format << (init->spec.empty() ? "" : ", " + init->spec)
               << (init->headsAssumed ? ", heads taken as width / 64: no config.json beside it" : "") << "): weights only";
  }
  init.reset();  // placed: the copy is no longer needed
  // --plot draws from the metrics: without --metrics they go to a temporary file, removed after.
  std::optional<cli::PlotMetricsFile> plotMetrics;
  if (f.metrics.empty() && !f.plot.empty() && world.rank == 0) plotMetrics.emplace();  // cli/plot.h
  const std::string metricsPath = plotMetrics ? plotMetrics->path() : f.metrics;
  auto loss = nn::makeLoss(classification ? nn::LossKind::kCrossEntropy : nn::LossKind::kMse);
  train::Trainer trainer(job, *loss, *trainSet, testSet.get(),
                         {.epochs = f.epochs,
                          .batchSize = f.batchSize,
                          .accumulateSteps = f.accumulateSteps,
                          .seed = f.seed,
                          .prefetch = f.prefetch,
                          .augment = f.augment ? data::kStandardAugment : data::Augment{},
                          .classification = classification,
                          .checkpointPath = f.checkpoint,
                          .checkpointEvery = f.checkpointEvery,
                          .resume = f.resume,
                          .resumeOnNewData = f.resumeOnNewData,
                          .maxSteps = f.maxSteps,
                          .stopRequested = &gStopRequested,
                          .stopSignal = &gStopSignal,
                          .metricsPath = metricsPath,
                          .tensorboardDir = f.tensorboard,
                          .logEverySteps = f.logEverySteps,
                          .lrSchedule = lrScheduleOptions(f, lr),
                          .clipGradNorm = static_cast<float>(f.clipGradNorm),
                          .skipNonFinite = f.skipNonFinite,
                          .skipSpikes = f.skipSpikes,
                          .maxSpikesInARow = f.spikesInARow,
                          .progressEverySeconds = f.progressEvery,
                          .tracePath = f.trace,
                          .traceSpans = static_cast<size_t>(f.traceSpans),
                          .stepReport = f.stepReport,
                          // Every rank's epoch line (each with its own samples/s: Hogwild workers
                          // differ); the start-up lines are this command's own (below).
                          .logRanks = train::LogRanks::kEveryRank,
                          .logStartLine = false});
  // From here a stop request is honoured (a checkpoint at the loop's first step); the line below tells
  // whoever watches that it is.
  gStopsAtEpochEnd.store(!job.lockstep() && world.spansNodes());
  gTrainingReady.store(true);
  const bool shared = job.sharedParams() && world.worldSize > 1;
  log.info() << "cohort train: " << spec << " (" << model->params.numel() << " parameters"
             << (shared && !world.spansNodes() ? ", shared by " + std::to_string(world.worldSize) + " workers" : std::string())
             << (shared && world.spansNodes() ? ", one copy per node" : std::string()) << ") on "
             << trainSet->name() << " (" << trainer.loader().samplesPerEpoch() << " samples per epoch"
             << (testSet ? ", test " + std::to_string(testSet->size()) : std::string()) << "), " << optimizer->name()
             << " lr " << lr << (trainer.lrSchedule() ? " (" + trainer.lrSchedule()->describe() + ")" : std::string())
             << ", batch " << f.batchSize << ", "
             << (job.device().isCuda() ? "on " + job.device().str() : std::to_string(f.threads) + " BLAS thread(s)");
  reportEffectiveBatch(log, f, world, lr);
  if (job.averageEvery() > 0) {
    log.info() << "hogwild across nodes: one parameter copy per node, the nodes' copies averaged over MPI every "
               << job.averageEvery() << " steps of each node's first worker (overlapped with training) and at every "
                  "epoch's end";
  }
  if (trainer.loader().prefetchDepth() < f.prefetch) {
    log.info() << "--prefetch " << f.prefetch << " capped at " << trainer.loader().prefetchDepth()
               << " batches (the batches per epoch of this worker, and at most 256 MiB of batches ahead)";
  }
  train::TrainResult result;
  try {
    result = trainer.run();
  } catch (const std::exception&) {
    // A GPU Hogwild worker whose owner died usually learns it from a failing kernel or copy first:
    // report the cause rather than the symptom.
    job.checkPeers(std::chrono::seconds(1));
    throw;
  }
  if (world.rank == 0) std::printf("%s\n", resultLine(job, result, classification, hints.context > 0 ? hints.context : 1).c_str());
  std::fflush(stdout);
  if (job.device().isCuda()) log.info() << "input wait on " << job.device().str() << ": " << result.inputWaitMs << " ms in all";
  if (f.memoryReport) reportMemory(log, job.device(), job.deviceMemoryStats());
  if (!f.plot.empty() && world.rank == 0) {
    cli::PlotSummary drawn = cli::writePlot({{.metricsPath = metricsPath, .label = spec}}, {.outputPath = f.plot});
    log.info() << "plot of " << drawn.points << " points written to " << f.plot;
  }
  if (result.stoppedByRequest && world.rank == 0) {
    log.info() << "stopped on request after step " << result.steps
               << (f.checkpoint.empty() ? "; no --checkpoint was given, so nothing was saved"
                                        : "; continue with the same command and --resume");
  }
  // Stopped by SIGTERM or SIGHUP: exit as that signal says (143, 129), having saved what it could.
  const int terminating = gTerminatingSignal.load();
  return result.stoppedByRequest && terminating != 0 ? 128 + terminating : 0;
}

}  // namespace cohort::cli
