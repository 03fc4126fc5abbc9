#include "cli/train_command.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>

#include "cli/cairo_library.h"         // --plot: cairo is there before the run
#include "cli/memory_estimate.h"       // a floor of what the run needs, before it allocates
#include "cli/plot.h"                  // --plot
#include "cli/stop_signal.h"           // SIGUSR1, SIGTERM, SIGHUP: checkpoint and stop
#include "cli/test_hooks.h"            // COHORT_TEST_*: faults tests inject
#include "cli/train_samples.h"         // --sample-every, --tokenizer
#include "nn/checkpoint.h"             // checkOutputFile
#include "nn/loss.h"                   // losses
#include "nn/model_spec.h"             // --model specs
#include "nn/model_weights.h"          // --init-from
#include "nn/tokenizer.h"              // --tokenizer: its digest goes into the checkpoints
#include "runtime/cpu/blas.h"          // --threads
#include "runtime/data/dataset.h"      // --data specs
#include "runtime/device_query.h"      // formatBytes
#include "runtime/dtype.h"             // --precision
#include "runtime/error.h"
#include "runtime/gpu_options.h"       // --conv-algorithms
#include "runtime/logging.h"
#include "runtime/output_file.h"       // the outputs' directories
#include "runtime/process_memory.h"    // --memory-report on the CPU
#include "runtime/timeout.h"           // --timeout
#include "runtime/world_info.h"
#include "train/job.h"                 // the job: world, device, placement, collectives
#include "train/trainer.h"             // the training loop
#include "train/zero_memory.h"         // the shard group the memory floor counts

namespace cohort::cli {

namespace data = runtime::data;

namespace {

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

// --memory-report: what the rank holds of the model's state (Job::stateBytes(), from the
// placement's buffers: beside the estimate rank 0 printed before the run), and what the run held, in
// the terms of torch.cuda.memory_allocated/_reserved and max_memory_allocated on a GPU; on the CPU
// the process's peak resident size and what is resident now, by kind (runtime/process_memory.h):
// the private part is what each further worker costs.
void reportMemory(const runtime::Logger& log, const train::Job& job) {
  const train::StateBytes s = job.stateBytes();
  log.info() << "memory report (model state, --zero " << job.options().zero
             << "): parameters " << runtime::formatBytes(s.params) << ", gradients " << runtime::formatBytes(s.grads)
             << ", optimizer state " << runtime::formatBytes(s.optimizer) << ", temporary buffers "
             << runtime::formatBytes(s.staging);
  const runtime::Device& device = job.device();
  const std::optional<runtime::AllocatorStats> gpu = job.deviceMemoryStats();
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

// --model, else the model of --init-from's weights, else the default. A gpt: --model without vocab=
// takes the tokenizer's size (--pad-vocab: padded to a multiple of 128, as llm.c's 50304).
std::string modelSpec(const TrainFlags& f, const nn::ModelWeights* init, const nn::Tokenizer* tokenizer) {
  if (f.padVocab && !tokenizer) COHORT_THROW(InvalidArgument) << "--pad-vocab pads --tokenizer's vocabulary: give --tokenizer";
  if (f.model.starts_with("gpt:") && f.model.find("vocab=") == std::string::npos) {
    if (tokenizer) {
      const int64_t size = tokenizer->size(), padded = (size + 127) / 128 * 128;
      const std::string pad = f.padVocab && padded != size ? ",padded_vocab=" + std::to_string(padded) : "";
      return f.model + ",vocab=" + std::to_string(size) + pad;
    }
  } else if (f.padVocab) {
    COHORT_THROW(InvalidArgument) << "--pad-vocab is for a gpt: --model without vocab= (it sets vocab= from --tokenizer)";
  }
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

// One line per rank of a job of several: who it is, where, and from which launcher's variables.
void logRank(const runtime::Logger& log, const runtime::WorldInfo& world) {
  if (world.isSingle()) return;
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  log.info() << "rank " << world.rank << " of " << world.worldSize << " (local " << world.localRank << " of "
             << world.localWorldSize << ") on " << host << " from " << world.source << " variables, job " << world.jobId
             << (world.restartCount ? ", restart " + std::to_string(world.restartCount) : std::string());
}

// --threads, and a warning where it is more than the CPUs this worker may use.
void setThreads(const runtime::Logger& log, const TrainFlags& f) {
  runtime::cpu::setBlasThreads(f.threads);
  if (f.threads > allowedCpus() && !f.device.starts_with("cuda")) {
    log.warn() << "--threads " << f.threads << " is more than the " << allowedCpus()
               << " CPU(s) this worker may use: the BLAS threads will take turns (slower, not faster)";
  }
}

train::JobOptions jobOptions(const TrainFlags& f) {
  return {.mode = train::parseMode(f.mode),
          .backend = train::parseBackend(f.backend),
          .paramCopies = f.replicas     ? train::ParamCopies::kReplicas
                         : f.noReplicas ? train::ParamCopies::kSharedPerNode
                                        : train::ParamCopies::kAuto,
          .zero = f.zero,
          .zeroScope = train::parseZeroScope(f.zeroScope),
          .device = f.device,
          .timeout = runtime::timeoutFromSeconds(f.timeout, "--timeout"),
          .averageEvery = f.averageEvery,
          .convAlgorithms = runtime::parseConvAlgorithms(f.convAlgorithms.empty() ? "fastest" : f.convAlgorithms),
          .tf32 = f.tf32,
          .gemmTuning = runtime::parseGemmTuning(f.gemmTuning, "--gemm-tuning"),
          .precision = runtime::parseDType(f.precision, "--precision"),
          .testHooks = testHooksFromEnvironment()};
}

// A gpt: spec without vocab= (or a tokenizer) has a vocabulary of bytes: token shards of a tokenizer's ids
// (llm.c's begin with <|endoftext|>, 50256) are refused at their first windows, naming the vocab to
// add, rather than at the first id past 255 within training.
void checkByteVocabulary(const TrainFlags& f, const std::string& spec, const data::Dataset& train) {
  if (!f.data.starts_with("tokens:") || !spec.starts_with("gpt:") || spec.find("vocab=") != std::string::npos) return;
  try {
    (void)train.rows(0, std::min<int64_t>(train.size(), 8));
  } catch (const InvalidArgument& e) {
    COHORT_THROW(InvalidArgument) << e.what() << ": --model " << spec << " has no vocab=, so its vocabulary is bytes; "
                                  << "add vocab=50257 for GPT-2's (padded as llm.c's: vocab=50257,padded_vocab=50304), "
                                  << "or give --tokenizer to take its size";
  }
}

// What a run trains: the model (from --model or --init-from's weights), its data and optimizer.
struct Run {
  std::string spec;
  std::unique_ptr<nn::Model> model;
  double lr = 0;
  data::DatasetHints hints;
  std::unique_ptr<data::Dataset> trainSet;
  std::unique_ptr<data::Dataset> testSet;  // every rank holds it: the ranks evaluate a share each
  std::unique_ptr<nn::Optimizer> optimizer;
  bool classification = true;
  std::string tokenizerDigest;  // --tokenizer's (nn::Tokenizer::digest), recorded in the checkpoints
  TrainSamples samples;  // --sample-every's prompt and decoder
};

// Builds the run and has the job place it (the ranks meet and agree on their settings there).
Run placeRun(const TrainFlags& f, const runtime::WorldInfo& world, const runtime::Logger& log, train::Job& job) {
  Run run;
  run.classification = f.loss == "ce";
  std::optional<nn::ModelWeights> init;
  if (!f.initFrom.empty()) init = nn::readModelWeights(f.initFrom);
  std::shared_ptr<const nn::Tokenizer> tokenizer;
  if (!f.tokenizer.empty()) tokenizer = std::make_shared<const nn::Tokenizer>(nn::Tokenizer::read(f.tokenizer));
  if (tokenizer) run.tokenizerDigest = tokenizer->digest();
  run.spec = modelSpec(f, init ? &*init : nullptr, tokenizer.get());
  run.model = nn::buildModel(run.spec);
  applyRecompute(f, *run.model);  // --recompute, before the memory floor counts its activations
  if (init) nn::checkWeightsFit(*run.model, *init);
  run.lr = scaledLr(f, world);
  run.hints = train::datasetHints(*run.model, f.seed);
  run.trainSet = data::openDataset(f.data, data::Split::kTrain, run.hints);
  checkByteVocabulary(f, run.spec, *run.trainSet);
  run.testSet = openTestSet(f, run.hints);
  if (!run.testSet && world.rank == 0) {
    const bool tokens = f.data.rfind("tokens:", 0) == 0;
    log.info() << "no validation: " << f.data << " has no test split of its own; add "
               << (tokens ? "--test-data tokens:VAL_SHARDS (llm.c's val shards)" : "--test-data csv:FILE")
               << " to evaluate" << (f.evalEvery > 0 ? " (--eval-every has nothing to evaluate)" : "");
  }
  run.samples = trainSamples(f, *run.model, tokenizer);
  checkFits(*run.model, *run.trainSet, run.classification);
  if (run.testSet) checkFits(*run.model, *run.testSet, run.classification);
  // Before the optimizer's state or the parameters are allocated.
  const train::ZeroScope scope = train::parseZeroScope(f.zeroScope);
  const int shardGroup = train::shardGroupSize(world, scope);
  const bool onGpu = job.device().isCuda();
  checkMemoryEstimate({.model = *run.model,
                       .optimizer = optimizerOptions(f, run.lr),
                       .data = *run.trainSet,
                       .batchSize = f.batchSize,
                       .context = run.hints.context,
                       .onGpu = onGpu,
                       .device = onGpu ? job.device().index : 0,
                       .zero = f.zero,
                       .shardGroup = shardGroup,
                       .zeroRuns = f.mode == "allreduce" && !f.noReplicas && shardGroup > 1,
                       .precision = job.options().precision,
                       .report = f.memoryReport,
                       .testAvailableBytes = testMemoryAvailableFromEnvironment()},
                      world, log);
  run.optimizer = job.makeOptimizer(optimizerOptions(f, run.lr, *run.model), *run.model);  // a ZeRO job's: the shard's
  job.place(*run.model, *run.optimizer,
            {.seed = f.seed,
             .initialise = init ? std::function<void(nn::Model&)>([&](nn::Model& m) { nn::copyWeights(m, *init); }) : nullptr,
             .settings = {{"loss", f.loss}, {"init_from", f.initFrom}}});
  if (init) {
    log.info() << "started from " << f.initFrom << " (" << init->format << (init->spec.empty() ? "" : ", " + init->spec)
               << (init->headsAssumed ? ", heads taken as width / 64: no config.json beside it" : "") << "): weights only";
  }
  return run;  // the weights' copy goes: placed, it is no longer needed
}

train::TrainerOptions trainerOptions(const TrainFlags& f, const Run& run, const std::string& metricsPath,
                                     StopSignals& stop) {
  return {.epochs = f.epochs > 0 ? f.epochs : (f.maxSteps > 0 ? 0 : 1),
          .batchSize = f.batchSize,
          .accumulateSteps = f.accumulateSteps,
          .seed = f.seed,
          .prefetch = f.prefetch,
          .augment = f.augment ? data::kStandardAugment : data::Augment{},
          .classification = run.classification,
          .checkpointPath = f.checkpoint,
          .checkpointEvery = f.checkpointEvery,
          .resume = f.resume,
          .resumeOnNewData = f.resumeOnNewData,
          .tokenizerDigest = run.tokenizerDigest,
          .asyncCheckpoints = f.asyncCheckpoints,
          .maxSteps = f.maxSteps,
          .stepsPerEpoch = f.stepsPerEpoch,
          .stopRequested = &stop.requested,
          .stopSignal = &stop.signal,
          .metricsPath = metricsPath,
          .tensorboardDir = f.tensorboard,
          .logEverySteps = f.logEverySteps,
          .evalBatchSize = f.evalBatchSize,
          .evalEverySteps = f.evalEvery,
          .evalBatches = f.evalBatches,
          .sampleEverySteps = f.sampleEvery,
          .sampleTokens = f.sampleTokens,
          .samplePrompt = run.samples.prompt,
          .sampleDecode = run.samples.decode,
          .peakFlops = f.peakFlops,
          .lrSchedule = lrScheduleOptions(f, run.lr),
          .clipGradNorm = static_cast<float>(f.clipGradNorm),
          .skipNonFinite = f.skipNonFinite,
          .skipSpikes = f.skipSpikes,
          .maxSpikesInARow = f.spikesInARow,
          .progressEverySeconds = f.progressEvery,
          .tracePath = f.trace,
          .traceSpans = static_cast<size_t>(f.traceSpans),
          .stepReport = f.stepReport,
          .cudaGraphs = f.cudaGraphs == "on",
          // Every rank's epoch line (each with its own samples/s: Hogwild workers differ); the
          // start-up lines are this command's own (logStart).
          .logRanks = train::LogRanks::kEveryRank,
          .logStartLine = false};
}

// The start-up lines: what trains on what, the effective batch, Hogwild's averaging, a capped --prefetch.
void logStart(const runtime::Logger& log, const TrainFlags& f, const runtime::WorldInfo& world, const train::Job& job,
              const Run& run, train::Trainer& trainer) {
  const bool shared = job.sharedParams() && world.worldSize > 1;
  log.info() << "cohort train: " << run.spec << " (" << run.model->params.numel() << " parameters"
             << (shared && !world.spansNodes() ? ", shared by " + std::to_string(world.worldSize) + " workers" : std::string())
             << (shared && world.spansNodes() ? ", one copy per node" : std::string()) << ") on "
             << run.trainSet->name() << " (" << trainer.loader().samplesPerEpoch() << " samples per epoch"
             << (run.testSet ? ", test " + std::to_string(run.testSet->size()) : std::string()) << "), "
             << run.optimizer->name() << " lr " << run.lr
             << (trainer.lrSchedule() ? " (" + trainer.lrSchedule()->describe() + ")" : std::string()) << ", batch "
             << f.batchSize << ", "
             << (job.device().isCuda() ? "on " + job.device().str() : std::to_string(f.threads) + " BLAS thread(s)");
  reportEffectiveBatch(log, f, world, run.lr);
  if (job.averageEvery() > 0) {
    log.info() << "hogwild across nodes: one parameter copy per node, the nodes' copies averaged over MPI every "
               << job.averageEvery() << " steps of each node's first worker (overlapped with training) and at every "
                  "epoch's end";
  }
  if (trainer.loader().prefetchDepth() < f.prefetch) {
    log.info() << "--prefetch " << f.prefetch << " capped at " << trainer.loader().prefetchDepth()
               << " batches (the batches per epoch of this worker, and at most 256 MiB of batches ahead)";
  }
}

// After the run: the RESULT line, the reports, the plot, and the exit code: a stop on SIGTERM or
// SIGHUP exits as that signal says (143, 129), having saved what it could.
int finishTrain(const runtime::Logger& log, const TrainFlags& f, const runtime::WorldInfo& world, train::Job& job,
                const Run& run, const train::TrainResult& result, const std::string& metricsPath,
                const StopSignals& stop) {
  const int64_t tokensPerSample = run.hints.context > 0 ? run.hints.context : 1;
  if (world.rank == 0) std::printf("%s\n", resultLine(job, result, run.classification, tokensPerSample).c_str());
  std::fflush(stdout);
  if (job.device().isCuda()) log.info() << "input wait on " << job.device().str() << ": " << result.inputWaitMs << " ms in all";
  if (f.memoryReport) reportMemory(log, job);
  if (!f.plot.empty() && world.rank == 0) {
    cli::PlotSummary drawn = cli::writePlot({{.metricsPath = metricsPath, .label = run.spec}}, {.outputPath = f.plot});
    log.info() << "plot of " << drawn.points << " points written to " << f.plot;
  }
  if (result.stoppedByRequest && world.rank == 0) {
    log.info() << "stopped on request after step " << result.steps
               << (f.checkpoint.empty() ? "; no --checkpoint was given, so nothing was saved"
                                        : "; continue with the same command and --resume");
  }
  const int terminating = stop.terminating.load();
  return result.stoppedByRequest && terminating != 0 ? 128 + terminating : 0;
}

}  // namespace

int runTrain(const TrainFlags& f) {
  // First thing: a SIGUSR1 during set-up (a job started close to its time limit) must not kill the
  // worker; the loop sees the request at its first step.
  StopSignals& stop = installStopSignals();
  const runtime::WorldInfo world = runtime::WorldInfo::detect();
  validateTrainFlags(f, world);
  runtime::Logger log(world, {.fd = 1});
  logRank(log, world);
  setThreads(log, f);
  // The directories of the outputs are made as nanoGPT makes its out_dir (every rank: a sharded
  // checkpoint's ranks all write); then every output path is checked before anything runs, the same
  // way (nn::checkOutputFile): the Trainer checks --checkpoint, --metrics, --trace and --tensorboard
  // on rank 0, this the image.
  for (const std::string* path : {&f.checkpoint, &f.metrics, &f.trace, &f.plot}) {
    if (!path->empty()) runtime::createParentDirectories(*path);
  }
  if (!f.tensorboard.empty()) runtime::createDirectories(f.tensorboard);
  if (!f.plot.empty() && world.rank == 0) {
    nn::checkOutputFile(f.plot, "the plot");
    CairoLibrary{};  // a missing cairo fails here (exit 2), not after the run
  }
  train::Job job(jobOptions(f), world);
  const Run run = placeRun(f, world, log, job);
  // --plot draws from the metrics: without --metrics they go to a temporary file, removed after.
  std::optional<cli::PlotMetricsFile> plotMetrics;
  if (f.metrics.empty() && !f.plot.empty() && world.rank == 0) plotMetrics.emplace();  // cli/plot.h
  const std::string metricsPath = plotMetrics ? plotMetrics->path() : f.metrics;
  auto loss = nn::makeLoss(run.classification ? nn::LossKind::kCrossEntropy : nn::LossKind::kMse);
  train::Trainer trainer(job, *loss, *run.trainSet, run.testSet.get(), trainerOptions(f, run, metricsPath, stop));
  // From here a stop request is honoured (a checkpoint at the loop's first step); the lines below
  // tell whoever watches that it is.
  stop.stopsAtEpochEnd.store(!job.lockstep() && world.spansNodes());
  stop.trainingReady.store(true);
  logStart(log, f, world, job, run, trainer);
  train::TrainResult result;
  try {
    result = trainer.run();
  } catch (const std::exception&) {
    // A GPU Hogwild worker whose owner died usually learns it from a failing kernel or copy first:
    // report the cause rather than the symptom.
    job.checkPeers(std::chrono::seconds(1));
    throw;
  }
  return finishTrain(log, f, world, job, run, result, metricsPath, stop);
}

}  // namespace cohort::cli
