#include "cli/train_command.h"

#include <CLI/CLI.hpp>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <thread>

#include <sys/resource.h>

#include "collectives/communicator.h"
#include "ipc/shared_params.h"
#include "nn/hogwild.h"
#include "nn/sharded_sync.h"
#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "nn/replica_sync.h"
#include "nn/trainer.h"
#include "runtime/cpu/blas.h"
#include "runtime/data/data_loader.h"
#include "runtime/data/dataset.h"
#include "runtime/device_query.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/world_info.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#endif

namespace cohort::cli {

namespace data = runtime::data;

void addTrainFlags(CLI::App& c, TrainFlags& f) {
  c.add_option("--model", f.model, "model spec: mlp:IN,HIDDEN...,OUT | cnn:lenet | cnn:lenet-bn | cnn:rosetta")->capture_default_str();
  c.add_option("--data", f.data, "training data: synthetic | synthetic-cifar[:N] | mnist:DIR | cifar10:DIR | csv:FILE")
      ->capture_default_str();
  c.add_flag("--augment", f.augment, "random crop (padding 4) and horizontal flip of image samples [C,H,W] while training");
  c.add_option("--test-data", f.testData, "test data (default: the test split of --data; none for csv)");
  c.add_option("--mode", f.mode, "local | hogwild | allreduce")->capture_default_str();
  c.add_option("--backend", f.backend, "all-reduce backend: shm | mpi | nccl");
  c.add_flag("--replicas", f.replicas,
             "--mode allreduce --backend shm: a full replica per worker and bucketed gradient all-reduce, instead of "
             "one shared parameter copy that each worker updates a shard of");
  c.add_option("--device", f.device, "cpu | cuda[:N]")->capture_default_str();
  c.add_option("--epochs", f.epochs, "epochs to train")->capture_default_str();
  c.add_option("--batch-size", f.batchSize, "samples per step and worker")->capture_default_str();
  c.add_option("--lr", f.lr, "learning rate")->capture_default_str();
  c.add_option("--momentum", f.momentum, "SGD momentum")->capture_default_str();
  c.add_flag("--nesterov", f.nesterov, "Nesterov momentum (SGD)");
  c.add_option("--optimizer", f.optimizer, "sgd | adam | adamw")->capture_default_str();
  c.add_option("--weight-decay", f.weightDecay, "L2 penalty (sgd, adam) or decoupled decay (adamw; default 0.01)");
  c.add_option("--loss", f.loss, "ce (softmax cross-entropy) | mse")->capture_default_str();
  c.add_option("--threads", f.threads, "BLAS threads per worker")->capture_default_str();
  c.add_option("--seed", f.seed, "seed for initialisation, shuffling and dropout")->capture_default_str();
  c.add_option("--prefetch", f.prefetch, "batches the data loader gathers ahead")->capture_default_str();
  c.add_option("--checkpoint", f.checkpoint, "checkpoint file (safetensors), written every epoch");
  c.add_option("--checkpoint-every", f.checkpointEvery, "also write a checkpoint every N steps");
  c.add_flag("--resume", f.resume, "continue from --checkpoint if it exists");
  c.add_option("--max-steps", f.maxSteps, "stop after N optimizer steps in all (a checkpoint is written)");
  c.add_option("--metrics", f.metrics, "append one JSON line per epoch to this file");
  c.add_flag("--memory-report", f.memoryReport,
             "print the memory the run used at the end (GPU: the caching allocator's allocated, reserved and peak bytes)");
  c.add_option("--timeout", f.timeout, "seconds to wait for other workers (start-up, barriers) before failing")
      ->capture_default_str();
}

namespace {

void validate(const TrainFlags& f, const runtime::WorldInfo& world) {
  if (f.mode != "local" && f.mode != "hogwild" && f.mode != "allreduce") {
    COHORT_THROW(InvalidArgument) << "unknown --mode '" << f.mode << "': expected local, hogwild or allreduce";
  }
  if (f.mode == "local" && !world.isSingle()) {
    COHORT_THROW(InvalidArgument) << "--mode local trains in one process, but this process is rank " << world.rank << " of "
                                  << world.worldSize << " (from " << world.source
                                  << " variables): use --mode allreduce or --mode hogwild";
  }
  if (f.mode == "hogwild") {
    if (world.spansNodes()) {
      COHORT_THROW(InvalidArgument) << "--mode hogwild shares memory, so every rank must be on one node, but this job has "
                                    << world.worldSize << " ranks with " << world.localWorldSize << " on this node";
    }
    if (f.checkpointEvery > 0 || f.maxSteps > 0) {
      COHORT_THROW(InvalidArgument) << "--checkpoint-every and --max-steps need --mode local: Hogwild workers meet (and "
                                       "checkpoint) only at the end of each epoch";
    }
  }
  if (!(f.timeout > 0)) COHORT_THROW(InvalidArgument) << "--timeout must be positive, got " << f.timeout;
  if (!f.backend.empty() && f.mode != "allreduce") COHORT_THROW(InvalidArgument) << "--backend applies to --mode allreduce only";
  if (f.replicas && f.mode != "allreduce") COHORT_THROW(InvalidArgument) << "--replicas applies to --mode allreduce only";
  const bool onGpu = runtime::Device::parse(f.device).isCuda();
  if (onGpu && f.mode == "allreduce" && !f.backend.empty() && f.backend != "nccl") {
    COHORT_THROW(InvalidArgument) << "--backend " << f.backend << " all-reduces CPU memory; with --device " << f.device
                                  << " use --backend nccl (the default on a GPU)";
  }
  if (!onGpu && f.backend == "nccl") {
    COHORT_THROW(InvalidArgument) << "--backend nccl all-reduces GPU memory: add --device cuda (or use shm or mpi)";
  }
  if (onGpu && f.replicas) COHORT_THROW(InvalidArgument) << "--replicas applies to CPU training (GPU all-reduce always replicates)";
  if (f.epochs <= 0) COHORT_THROW(InvalidArgument) << "--epochs must be positive, got " << f.epochs;
  if (f.batchSize <= 0) COHORT_THROW(InvalidArgument) << "--batch-size must be positive, got " << f.batchSize;
  if (f.prefetch < 0) COHORT_THROW(InvalidArgument) << "--prefetch must be >= 0, got " << f.prefetch;
  if (f.maxSteps < 0) COHORT_THROW(InvalidArgument) << "--max-steps must be >= 0";
  if (f.checkpointEvery < 0) COHORT_THROW(InvalidArgument) << "--checkpoint-every must be >= 0";
  if ((f.resume || f.checkpointEvery > 0) && f.checkpoint.empty()) {
    COHORT_THROW(InvalidArgument) << (f.resume ? "--resume" : "--checkpoint-every") << " needs --checkpoint PATH";
  }
  if (f.loss != "ce" && f.loss != "mse") COHORT_THROW(InvalidArgument) << "unknown --loss '" << f.loss << "': expected ce or mse";
}

std::unique_ptr<data::Dataset> openTestSet(const TrainFlags& f) {
  if (!f.testData.empty()) {
    bool csv = f.testData.rfind("csv:", 0) == 0;
    return data::openDataset(f.testData, csv ? data::Split::kTrain : data::Split::kTest);
  }
  if (f.data.rfind("csv:", 0) == 0) return nullptr;
  return data::openDataset(f.data, data::Split::kTest);
}

void checkFits(const nn::Model& model, const data::Dataset& d, bool classification) {
  if (d.sampleShape().numel() != model.sampleShape.numel()) {
    COHORT_THROW(InvalidArgument) << "model " << model.spec << " takes " << model.sampleShape.numel()
                                  << " input features, but " << d.name() << " has " << d.sampleShape().numel();
  }
  if (classification && d.numClasses() == 0) {
    COHORT_THROW(InvalidArgument) << d.name() << " has targets that are not class indices: use --loss mse for regression";
  }
  if (classification && d.numClasses() > model.outputs) {
    COHORT_THROW(InvalidArgument) << d.name() << " has " << d.numClasses() << " classes, but model " << model.spec
                                  << " has " << model.outputs << " outputs";
  }
  if (!classification && d.targetShape().numel() != model.outputs) {
    COHORT_THROW(InvalidArgument) << d.name() << " has " << d.targetShape().numel() << " target values per sample, but model "
                                  << model.spec << " has " << model.outputs << " outputs";
  }
}

}  // namespace

namespace {

nn::OptimizerOptions optimizerOptions(const TrainFlags& f) {
  nn::OptimizerOptions opt;
  opt.kind = nn::parseOptimizerKind(f.optimizer);
  opt.lr = static_cast<float>(f.lr);
  opt.momentum = static_cast<float>(f.momentum);
  opt.nesterov = f.nesterov;
  opt.weightDecay = static_cast<float>(f.weightDecay >= 0 ? f.weightDecay : opt.kind == nn::OptimizerKind::kAdamW ? 0.01 : 0.0);
  return opt;
}

bool fileExists(const std::string& path) { return !path.empty() && std::ifstream(path).good(); }

// SIGUSR1 (SLURM sends it before the time limit with --signal=USR1@SECONDS; cohortrun forwards it)
// asks the training loop to checkpoint and stop cleanly. The flag is the one global, and only the
// program (never the library) has it.
//
// The signal is never delivered to a training thread: it is blocked before any thread exists (every
// thread inherits the mask) and taken by one thread of its own with sigwait(). A handler running on
// a training thread's stack corrupted the heap: Debian's oneDNN 2.6 sgemm kernels keep data below
// the stack pointer, beyond the red zone, where the kernel writes the signal frame (seen as
// "corrupted size vs. prev_size" aborts and SIGSEGVs in cli_allreduce_test's SIGUSR1 case; valgrind
// shows oneDNN reading below its stack pointer).
std::atomic<bool> gStopRequested{false};

void installStopSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int signal = 0;
    while (sigwait(&set, &signal) == 0) gStopRequested.store(true, std::memory_order_relaxed);
  }).detach();
}

// --memory-report: what the run held, in the terms of torch.cuda.memory_allocated/_reserved and
// max_memory_allocated on a GPU; the process's peak resident size on the CPU.
void reportMemory(const runtime::Logger& log, const runtime::Device& device, const runtime::AllocatorStats* gpu) {
  if (gpu) {
    log.info() << "memory report (" << device.str() << " caching allocator): allocated "
               << runtime::formatBytes(gpu->allocatedBytes) << ", reserved " << runtime::formatBytes(gpu->reservedBytes)
               << ", peak allocated " << runtime::formatBytes(gpu->peakAllocatedBytes) << ", peak reserved "
               << runtime::formatBytes(gpu->peakReservedBytes) << ", " << gpu->allocationCount << " allocations ("
               << gpu->systemAllocations << " from the driver)";
    return;
  }
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  log.info() << "memory report (cpu): peak resident " << runtime::formatBytes(static_cast<size_t>(usage.ru_maxrss) * 1024);
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
    log.info() << "rank " << world.rank << " of " << world.worldSize << " (local " << world.localRank << " of "
               << world.localWorldSize << ") from " << world.source << " variables, job " << world.jobId
               << (world.restartCount ? ", restart " + std::to_string(world.restartCount) : std::string());
  }
  runtime::cpu::setBlasThreads(f.threads);
  const bool classification = f.loss == "ce";
  const bool hogwild = f.mode == "hogwild";
  // One worker per GPU: "cuda" is the GPU of this worker's local rank.
  const runtime::Device device = runtime::selectDevice(f.device, world.localRank);
#ifdef COHORT_HAVE_CUDA
  std::unique_ptr<runtime::cuda::GpuContext> gpu;
  if (device.isCuda()) gpu = std::make_unique<runtime::cuda::GpuContext>(device);
  runtime::cuda::GpuContext* gpuContext = gpu.get();
#else
  runtime::cuda::GpuContext* gpuContext = nullptr;
#endif

  std::unique_ptr<nn::Model> model = nn::buildModel(f.model);
  auto optimizer = nn::makeOptimizer(optimizerOptions(f), model->params.numel(), gpuContext);
  std::unique_ptr<data::Dataset> train = data::openDataset(f.data, data::Split::kTrain);
  std::unique_ptr<data::Dataset> test = world.rank == 0 ? openTestSet(f) : nullptr;
  checkFits(*model, *train, classification);
  if (test) checkFits(*model, *test, classification);

  // Parameters: private (local, allreduce replicas) or in a segment every worker of this node shares
  // (hogwild; allreduce over shm: one copy, sharded update). Either way they start from the same
  // seeded initialisation, or from the checkpoint being resumed.
  const bool sharded = f.mode == "allreduce" && !f.replicas && !device.isCuda() &&
                       collectives::resolveBackend({.backend = f.backend, .world = world}) == "shm";
  const bool paramsShared = hogwild || sharded;
  // Shared parameters are loaded here, once, by their creator; private ones by the Trainer.
  auto initialiseModel = [&](nn::Model& m) {
    runtime::Rng initRng(runtime::mix(f.seed, 0x696e6974ull /* "init" */));
    m.net->resetParams(initRng);
    if (paramsShared && f.resume && fileExists(f.checkpoint)) nn::loadParamsFromCheckpoint(f.checkpoint, m.params);
  };
  auto initialise = [&] { initialiseModel(*model); };
  // On a GPU: initialised on the CPU (the same numbers as a CPU run), then copied to the GPU once.
  auto bindInitialisedOnGpu = [&] {
#ifdef COHORT_HAVE_CUDA
    std::unique_ptr<nn::Model> host = nn::buildModel(f.model);
    host->params.allocate(runtime::cpuAllocator());
    initialiseModel(*host);
    nn::bindOnGpu(*model, *host, *gpu);
#endif
  };
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(f.timeout * 1000));
  std::unique_ptr<ipc::SharedParams> shared;
  nn::GpuShare gpuShare;  // GPU Hogwild
  std::unique_ptr<collectives::Communicator> comm;
  std::unique_ptr<nn::JobSync> sync;
  const nn::HogwildOptions segmentOptions{.jobId = world.jobId, .localRank = world.localRank,
                                          .localWorldSize = world.localWorldSize,
                                          .generation = static_cast<uint64_t>(world.restartCount), .timeout = timeout};
  if (sharded) {
    shared = nn::shareForShardedTraining(*model, *optimizer, segmentOptions, initialise);
    sync = std::make_unique<nn::ShardedSync>(*shared, timeout);
  } else if (f.mode == "allreduce") {
    // Replicas: each rank initialises its own copy, then rank 0's is broadcast to all of them. On a
    // GPU the gradient buckets are all-reduced over NCCL, ordered after backward's kernels by events.
    const runtime::Stream* computeStream = nullptr;
#ifdef COHORT_HAVE_CUDA
    if (gpu) computeStream = &gpu->stream();
#endif
    comm = collectives::makeCommunicator({.backend = device.isCuda() && f.backend.empty() ? "nccl" : f.backend,
                                          .world = world, .timeout = timeout, .computeStream = computeStream});
    if (device.isCuda()) {
      bindInitialisedOnGpu();
    } else {
      model->params.allocate(runtime::cpuAllocator());
      initialise();
    }
    auto replicas = std::make_unique<nn::ReplicaSync>(*comm, model->params, nn::GradSyncOptions{.timeout = timeout});
    replicas->broadcastParams();
    sync = std::move(replicas);
  } else if (hogwild && device.isCuda()) {
    // One device allocation of local rank 0, opened by the others through CUDA IPC.
    nn::HogwildOptions o = segmentOptions;
    o.scratchFloatsPerRank = optimizer->stateFloats();
    gpuShare = nn::shareParamsOnGpu(*model, o, *gpuContext, initialiseModel);
    sync = std::make_unique<nn::HogwildSync>(*gpuShare.segment, timeout, gpuShare.params.get());
  } else if (hogwild) {
    nn::HogwildOptions o = segmentOptions;
    o.scratchFloatsPerRank = optimizer->stateFloats();
    shared = nn::shareParams(*model, o, initialise);
    sync = std::make_unique<nn::HogwildSync>(*shared, timeout);
    optimizer->setSweepStart(nn::hogwildSweepStart(model->params.numel(), world.localRank, world.localWorldSize));
  } else if (device.isCuda()) {
    bindInitialisedOnGpu();
  } else {
    model->params.allocate(runtime::cpuAllocator());
    initialise();
  }
  auto loss = nn::makeLoss(classification ? nn::LossKind::kCrossEntropy : nn::LossKind::kMse);

  data::DataLoader loader(*train, {.batchSize = f.batchSize, .seed = f.seed, .rank = world.rank,
                                   .worldSize = world.worldSize, .prefetch = f.prefetch,
                                   .augment = f.augment ? data::kStandardAugment : data::Augment{}});
  log.info() << "cohort train: " << f.model << " (" << model->params.numel() << " parameters"
             << (hogwild ? ", shared by " + std::to_string(world.worldSize) + " workers" : std::string()) << ") on "
             << train->name() << " (" << loader.samplesPerEpoch() << " samples per epoch"
             << (test ? ", test " + std::to_string(test->size()) : std::string()) << "), " << optimizer->name() << " lr "
             << f.lr << ", batch " << f.batchSize << ", "
             << (device.isCuda() ? "on " + device.str() : std::to_string(f.threads) + " BLAS thread(s)");
  nn::TrainerOptions options;
  options.epochs = f.epochs;
  options.seed = f.seed;
  options.classification = classification;
  options.checkpointPath = f.checkpoint;
  options.checkpointEvery = f.checkpointEvery;
  options.resume = f.resume;
  options.maxSteps = f.maxSteps;
  options.metricsPath = f.metrics;
  options.mode = f.mode;
  options.backend = comm ? comm->backend() : sharded ? "shm" : "none";
  options.paramsShared = paramsShared;
  options.optimizerStateShared = sharded;
  options.stopRequested = &gStopRequested;
  options.gpu = gpuContext;
  nn::Trainer trainer(*model, *optimizer, *loss, loader, test.get(), world, log, options, sync.get());
  nn::TrainResult result;
  try {
    result = trainer.run();
  } catch (const std::exception&) {
    // A GPU Hogwild worker whose owner died usually learns it from a failing kernel or copy first:
    // report the cause rather than the symptom.
    if (gpuShare.params) gpuShare.params->throwIfOwnerLost(std::chrono::seconds(1));
    throw;
  }
  if (world.rank == 0) std::printf("%s\n", trainer.resultLine(result).c_str());
  std::fflush(stdout);
  if (device.isCuda()) log.info() << "input wait on " << device.str() << ": " << result.inputWaitMs << " ms in all";
  if (f.memoryReport) {
    runtime::AllocatorStats gpuStats;
#ifdef COHORT_HAVE_CUDA
    if (gpu) gpuStats = gpu->allocator().stats();
#endif
    reportMemory(log, device, device.isCuda() ? &gpuStats : nullptr);
  }
  if (result.stoppedBySignal && world.rank == 0) {
    log.info() << "stopped on request after step " << result.steps
               << (f.checkpoint.empty() ? "; no --checkpoint was given, so nothing was saved"
                                        : "; continue with the same command and --resume");
  }
  return 0;
}

}  // namespace cohort::cli
