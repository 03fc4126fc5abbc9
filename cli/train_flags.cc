#include "cli/train_flags.h"

#include <CLI/CLI.hpp>
#include <sched.h>

#include <cctype>
#include <cmath>
#include <limits>
#include <thread>

#include "cli/flag_values.h"       // --seed
#include "nn/gpt.h"                // --recompute
#include "runtime/data/data_loader.h"  // kMaxBatchSize
#include "runtime/device.h"        // --device
#include "runtime/dtype.h"         // --precision
#include "runtime/error.h"
#include "runtime/timeout.h"       // --timeout

namespace cohort::cli {

namespace data = runtime::data;

namespace {

// The flags of the model, its starting weights and the data.
void addModelAndDataFlags(CLI::App& c, TrainFlags& f) {
  c.add_option("--model", f.model,
               "model spec: mlp:IN,HIDDEN...,OUT | cnn:lenet | cnn:lenet-bn | cnn:rosetta | gpt:layers=L,heads=H,dim=D,ctx=T[,vocab=V] "
               "(default: --init-from's model, else " + std::string(kDefaultModel) + ")");
  c.add_option("--init-from", f.initFrom,
               "start from these weights (the optimizer starts fresh): a Cohort checkpoint, a HuggingFace GPT-2 "
               "(model.safetensors or its directory) or an llm.c model file (gpt2_124M.bin); --model, if given, must fit them");
  c.add_option("--data", f.data, std::string("training data: ") + kDataForms)
      ->capture_default_str();
  c.add_flag("--augment", f.augment, "random crop (padding 4) and horizontal flip of image samples [C,H,W] while training");
  c.add_option("--test-data", f.testData,
               "test data, any --data form (default: the test split of --data; none for csv and tokens:)");
  c.add_option("--tokenizer", f.tokenizer,
               std::string(kTokenizerForms) + ": a gpt: spec without vocab= takes its size; it encodes "
               "--sample-prompt and prints the samples; its digest is recorded in checkpoints, for generate to check");
  c.add_flag("--pad-vocab", f.padVocab,
             "with --tokenizer and a gpt: spec without vocab=: pad the vocabulary to a multiple of 128 (llm.c's 50304 for "
             "50257), the padding's logits left out of the loss (padded_vocab=)");
}

// The flags of how the workers train together and where.
void addJobFlags(CLI::App& c, TrainFlags& f) {
  c.add_option("--mode", f.mode, "local | hogwild | allreduce")->capture_default_str();
  c.add_option("--backend", f.backend,
               "all-reduce backend: shm | mpi | hierarchical | nccl (default: nccl on a GPU, shm on one node, "
               "hierarchical across nodes)");
  c.add_flag("--replicas", f.replicas,
             "--mode allreduce on the CPU: a full replica per worker and bucketed gradient all-reduce, instead of "
             "one shared parameter copy per node that each worker updates a slice of (the default across nodes)");
  c.add_flag("--no-replicas", f.noReplicas,
             "--mode allreduce on the CPU: one shared parameter copy per node, each worker updating a slice of it "
             "(the default on one node; across nodes over --backend hierarchical, the default there)");
  c.add_option("--zero", f.zero,
               "--mode allreduce, sharded data parallel (docs/sharding.md): 0 a full replica per worker, 1 the "
               "optimizer state sharded over the workers, 2 the gradients too, 3 the parameters too")
      ->capture_default_str();
  c.add_option("--zero-scope", f.zeroScope,
               "with --zero: shard over every worker of the job, or within each node (the shards replicated across "
               "nodes): job | node")
      ->capture_default_str();
  c.add_option("--device", f.device, "cpu | cuda[:N]")->capture_default_str();
}

// The flags of the optimizer step: batch, optimizer, learning rate, accumulation, clipping and skipping, the loss.
void addStepFlags(CLI::App& c, TrainFlags& f) {
  c.add_option("--epochs", f.epochs,
               "epochs to train (default 1; with --max-steps, as many as it takes, nanoGPT's max_iters, and "
               "--lr-schedule cosine then decays over --max-steps)");
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
               "(nanoGPT's lr_decay_iters; default: the last step of --epochs, or --max-steps without --epochs)");
  c.add_option("--step-size", f.stepSize, "step: optimizer steps between decays");
  c.add_option("--gamma", f.gamma, "step: the decay factor")->capture_default_str();
  c.add_option("--optimizer", f.optimizer, "sgd | adam | adamw")->capture_default_str();
  c.add_option("--weight-decay", f.weightDecay, "L2 penalty (sgd, adam) or decoupled decay (adamw; default 0.01)");
  c.add_option("--weight-decay-groups", f.weightDecayGroups,
               "matrices: the weight decay on the >= 2-D parameters only, not biases and LayerNorm (nanoGPT's "
               "groups; the default for a gpt) | all: on every parameter (the default for mlp and cnn models)")
      ->check(CLI::IsMember({"matrices", "all"}));
  c.add_option("--loss", f.loss, "ce (softmax cross-entropy) | mse")->capture_default_str();
}

// The flags of the worker's threads, the seed and the loader; checkpoints, resume and where to stop.
void addRunFlags(CLI::App& c, TrainFlags& f) {
  c.add_option("--threads", f.threads, "BLAS threads per worker")->capture_default_str();
  addSeedOption(c, f.seed, "seed for initialisation, shuffling and dropout (0 to 2^64-1)");
  c.add_option("--eval-batch-size", f.evalBatchSize,
               "samples per forward pass of the test set's evaluation, at most (fewer where their outputs would "
               "pass 64 MiB, or a language model's 4096 positions)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c.add_option("--prefetch", f.prefetch,
               "batches the data loader gathers ahead (capped at the batches per epoch and 256 MiB of batches)")
      ->capture_default_str();
  c.add_option("--checkpoint", f.checkpoint, "checkpoint file (safetensors), written every epoch");
  c.add_option("--checkpoint-every", f.checkpointEvery, "also write a checkpoint every N steps");
  c.add_flag("--resume", f.resume, "continue from --checkpoint if it exists");
  c.add_flag("--resume-on-new-data", f.resumeOnNewData,
             "with --resume: accept training data other than the checkpoint's (refused otherwise), keeping the "
             "weights, optimizer state and step count, and start the checkpoint's epoch afresh on it (a new order)");
  c.add_option("--max-steps", f.maxSteps,
               "stop after N optimizer steps in all (a checkpoint is written); in hogwild each worker counts its own");
  c.add_option("--steps-per-epoch", f.stepsPerEpoch,
               "an epoch is N optimizer steps (or the data's, if fewer): evaluation, epoch line and checkpoint there, "
               "and the next epoch a new order of the data (a run over a large corpus)");
  c.add_flag("--async-checkpoints", f.asyncCheckpoints,
             "with --zero: each checkpoint's shards are copied to memory and written in the background while "
             "training goes on, and committed at a later step once every worker's file is on disk");
}

// The flags of what the run reports: metrics, progress, TensorBoard, plot, trace and reports.
void addOutputFlags(CLI::App& c, TrainFlags& f) {
  c.add_option("--metrics", f.metrics, "append one JSON line per epoch to this file");
  c.add_option("--log-every-steps", f.logEverySteps,
               "every N optimizer steps rank 0 prints a step line (loss, lr, grad norm, ms/step, tokens/s, MFU) and "
               "appends it as a metrics line");
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
  c.add_option("--recompute", f.recompute,
               "a GPT's activation recompute: none, selective (LayerNorm, GELU and attention probabilities again "
               "in backward), full (each block's forward again in its backward); the same gradients, less memory")
      ->check(CLI::IsMember({"none", "selective", "full"}))
      ->capture_default_str();
  c.add_flag("--memory-report", f.memoryReport,
             "print the memory the run used at the end (GPU: the caching allocator's allocated, reserved and peak bytes)");
}

// The flags of watching a run: evaluation and samples every N steps, the MFU's peak.
void addWatchFlags(CLI::App& c, TrainFlags& f) {
  c.add_option("--peak-flops", f.peakFlops,
               "the device's peak FLOP/s for the MFU of the step lines (default: a GPU's from its compute capability, "
               "the CPU's measured by a short sgemm probe)");
  c.add_option(
      "--eval-every", f.evalEvery,
      "also evaluate the test set every N optimizer steps and before the first (log, metrics, TensorBoard, plot)");
  c.add_option("--eval-batches", f.evalBatches,
               "evaluations (the epochs' too) cover the test set's first K batches of --eval-batch-size samples, the "
               "same every time (nanoGPT's eval_iters; default: all of it)");
  c.add_option("--sample-every", f.sampleEvery,
               "a gpt: model: every N optimizer steps rank 0 prints a sample continuing --sample-prompt");
  c.add_option("--sample-tokens", f.sampleTokens, "tokens of each sample")->capture_default_str();
  c.add_option("--sample-prompt", f.samplePrompt,
               "the samples' prompt: text, encoded by --tokenizer (<|endoftext|> its special token), else its bytes")
      ->capture_default_str();
}

// The flags of Hogwild averaging across nodes, the GPU's arithmetic, and the wait for other workers.
void addTuningFlags(CLI::App& c, TrainFlags& f) {
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
  c.add_option("--cuda-graphs", f.cudaGraphs,
               "--device cuda: on (default) | off. On: a whole step (forward, backward, the gradient's norm, the step "
               "guard and the optimizer) is captured once as a CUDA graph and replayed for every later step of the "
               "same shapes (with --synchronous-steps the forward and backward only; a partial last batch and "
               "evaluation run uncaptured); local mode with one micro-batch per step, "
               "elsewhere steps run uncaptured and one line says why; the same parameters bit for bit (docs/gpu.md, "
               "\"CUDA graphs\"). No effect on the CPU")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  c.add_option("--gemm-tuning", f.gemmTuning,
               "--device cuda: on (default) | off. On: the first product of each shape times up to 8 of cuBLASLt's "
               "algorithms and keeps the fastest; off: the heuristic's first, the same algorithms run after run "
               "(docs/gpu.md, \"GEMM algorithms\"). Without the flag COHORT_GEMM_TUNING=on|off decides; the flag "
               "wins over it. No effect on the CPU")
      ->check(CLI::IsMember({"on", "off"}));
  c.add_option("--timeout", f.timeout, "seconds to wait for other workers (start-up, barriers, collectives) before failing; huge values and inf "
                 "wait about 100 years")
      ->capture_default_str();
}

}  // namespace

void addTrainFlags(CLI::App& c, TrainFlags& f) {
  addModelAndDataFlags(c, f);
  addJobFlags(c, f);
  addStepFlags(c, f);
  addRunFlags(c, f);
  addOutputFlags(c, f);
  addWatchFlags(c, f);
  addTuningFlags(c, f);
}

namespace {

// More BLAS threads than any machine we run on has cores: a typo, not a setting.
constexpr int kMaxThreads = 1024;
constexpr int64_t kMaxAccumulateSteps = int64_t{1} << 20;  // with 2^40 samples a batch: no product overflows

}  // namespace

int allowedCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return static_cast<int>(std::thread::hardware_concurrency());
  return CPU_COUNT(&set);
}

namespace {

// --mode, --backend and --replicas against each other and the world.
void validateJobFlags(const TrainFlags& f, const runtime::WorldInfo& world) {
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
  if (f.mode == "hogwild" && f.checkpointEvery > 0) {
    COHORT_THROW(InvalidArgument) << "--checkpoint-every needs workers that step together (--mode local or allreduce): "
                                     "Hogwild workers meet (and checkpoint) only at the end of each epoch (or at "
                                     "--max-steps)";
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
}

// The flags of --device cuda.
void validateDeviceFlags(const TrainFlags& f) {
  const bool onGpu = runtime::Device::parse(f.device).isCuda();
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
    COHORT_THROW(InvalidArgument) << (f.replicas ? "--replicas" : "--no-replicas") << " applies to CPU training (GPU all-reduce always replicates)";
  }
}

// Counts and sizes within their ranges.
void validateNumbers(const TrainFlags& f) {
  if (f.threads < 1 || f.threads > kMaxThreads) {
    COHORT_THROW(InvalidArgument) << "--threads must be 1.." << kMaxThreads << " BLAS threads per worker, got " << f.threads;
  }
  if (f.epochs < 0) COHORT_THROW(InvalidArgument) << "--epochs must be positive, got " << f.epochs;
  if (f.batchSize <= 0) COHORT_THROW(InvalidArgument) << "--batch-size must be positive, got " << f.batchSize;
  if (f.batchSize > data::kMaxBatchSize) {
    COHORT_THROW(InvalidArgument) << "--batch-size " << f.batchSize << " is above the largest supported, " << data::kMaxBatchSize
                                  << " (2^40); a batch as large as the data set takes all of it";
  }
  if (f.logEverySteps < 0) COHORT_THROW(InvalidArgument) << "--log-every-steps must be >= 0, got " << f.logEverySteps;
  const std::pair<const char*, int64_t> counts[] = {{"--eval-every", f.evalEvery},
                                                    {"--eval-batches", f.evalBatches},
                                                    {"--sample-every", f.sampleEvery},
                                                    {"--steps-per-epoch", f.stepsPerEpoch}};
  for (const auto& [flag, value] : counts) {
    if (value < 0) COHORT_THROW(InvalidArgument) << flag << " must be >= 0, got " << value;
  }
  if (f.sampleTokens <= 0) COHORT_THROW(InvalidArgument) << "--sample-tokens must be > 0, got " << f.sampleTokens;
  if (!(f.peakFlops >= 0) || !std::isfinite(f.peakFlops)) {
    COHORT_THROW(InvalidArgument) << "--peak-flops must be a finite number of FLOP/s >= 0, got " << f.peakFlops;
  }
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
}

// Outputs, checkpoints and the loss.
void validateOutputFlags(const TrainFlags& f) {
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
  if (f.asyncCheckpoints && (f.checkpoint.empty() || f.zero == 0)) {
    COHORT_THROW(InvalidArgument) << "--async-checkpoints needs --checkpoint PATH and --zero 1 or more (the shard files "
                                  << "are what is written in the background)";
  }
  if (f.loss != "ce" && f.loss != "mse") COHORT_THROW(InvalidArgument) << "unknown --loss '" << f.loss << "': expected ce or mse";
}

}  // namespace

void validateTrainFlags(const TrainFlags& f, const runtime::WorldInfo& world) {
  validateJobFlags(f, world);
  validateDeviceFlags(f);
  validateNumbers(f);
  validateOutputFlags(f);
}

void applyRecompute(const TrainFlags& f, nn::Model& model) {
  const nn::RecomputeMode mode = nn::parseRecompute(f.recompute);
  auto* gpt = dynamic_cast<nn::Gpt*>(model.net.get());
  if (gpt) return gpt->setRecompute(mode);
  if (mode != nn::RecomputeMode::kNone) {
    COHORT_THROW(InvalidArgument) << "--recompute " << f.recompute << " is for a GPT (--model gpt:...), not "
                                  << model.name << " (wrap a layer in nn::Recompute in a program of your own)";
  }
}

int64_t batchFactor(const TrainFlags& f, const runtime::WorldInfo& world) {
  return (f.mode == "allreduce" ? world.worldSize : 1) * f.accumulateSteps;
}

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

nn::OptimizerOptions optimizerOptions(const TrainFlags& f, double lr, const nn::Model& model) {
  nn::OptimizerOptions opt = optimizerOptions(f, lr);
  const std::string& groups =
      f.weightDecayGroups.empty() ? (model.name.rfind("gpt:", 0) == 0 ? "matrices" : "all") : f.weightDecayGroups;
  if (groups == "matrices") {
    opt.groups = nn::decayMatricesOnly(model.params, opt.weightDecay);
  } else if (groups != "all") {
    COHORT_THROW(InvalidArgument) << "unknown --weight-decay-groups '" << groups << "': expected matrices or all";
  }
  return opt;
}

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

}  // namespace cohort::cli
