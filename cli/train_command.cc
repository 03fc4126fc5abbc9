#include "cli/train_command.h"

#include <CLI/CLI.hpp>

#include <cstdio>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "nn/trainer.h"
#include "runtime/cpu/blas.h"
#include "runtime/data/data_loader.h"
#include "runtime/data/dataset.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/world_info.h"

namespace cohort::cli {

namespace data = runtime::data;

void addTrainFlags(CLI::App& c, TrainFlags& f) {
  c.add_option("--model", f.model, "model spec: mlp:IN,HIDDEN...,OUT")->capture_default_str();
  c.add_option("--data", f.data, "training data: synthetic | mnist:DIR | csv:FILE")->capture_default_str();
  c.add_option("--test-data", f.testData, "test data (default: the test split of --data; none for csv)");
  c.add_option("--mode", f.mode, "local | hogwild | allreduce")->capture_default_str();
  c.add_option("--backend", f.backend, "all-reduce backend: shm | mpi | nccl");
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
}

namespace {

void validate(const TrainFlags& f, const runtime::WorldInfo& world) {
  if (f.mode != "local" && f.mode != "hogwild" && f.mode != "allreduce") {
    COHORT_THROW(InvalidArgument) << "unknown --mode '" << f.mode << "': expected local, hogwild or allreduce";
  }
  if (f.mode != "local") {
    COHORT_THROW(InvalidArgument) << "--mode " << f.mode << " is not available in this version of cohort yet; use --mode local";
  }
  if (!world.isSingle()) {
    COHORT_THROW(InvalidArgument) << "--mode local trains in one process, but this process is rank " << world.rank << " of "
                                  << world.worldSize << " (from " << world.source << " variables)";
  }
  if (!f.backend.empty()) COHORT_THROW(InvalidArgument) << "--backend applies to --mode allreduce only";
  if (runtime::Device::parse(f.device).isCuda()) {
    COHORT_THROW(InvalidArgument) << "--device " << f.device << ": GPU training is not available in this version yet; use --device cpu";
  }
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

int runTrain(const TrainFlags& f) {
  const runtime::WorldInfo world = runtime::WorldInfo::detect();
  validate(f, world);
  runtime::Logger log(world, {.fd = 1});
  runtime::cpu::setBlasThreads(f.threads);
  const bool classification = f.loss == "ce";

  nn::OptimizerOptions opt;
  opt.kind = nn::parseOptimizerKind(f.optimizer);
  opt.lr = static_cast<float>(f.lr);
  opt.momentum = static_cast<float>(f.momentum);
  opt.nesterov = f.nesterov;
  opt.weightDecay = static_cast<float>(f.weightDecay >= 0 ? f.weightDecay : opt.kind == nn::OptimizerKind::kAdamW ? 0.01 : 0.0);
  std::unique_ptr<nn::Model> model = nn::buildModel(f.model);
  auto optimizer = nn::makeOptimizer(opt, model->params.numel());

  std::unique_ptr<data::Dataset> train = data::openDataset(f.data, data::Split::kTrain);
  std::unique_ptr<data::Dataset> test = openTestSet(f);
  checkFits(*model, *train, classification);
  if (test) checkFits(*model, *test, classification);

  model->params.allocate(runtime::cpuAllocator());
  runtime::Rng initRng(runtime::mix(f.seed, 0x696e6974ull /* "init" */));
  model->net->resetParams(initRng);
  auto loss = nn::makeLoss(classification ? nn::LossKind::kCrossEntropy : nn::LossKind::kMse);

  data::DataLoader loader(*train, {.batchSize = f.batchSize, .seed = f.seed, .rank = world.rank,
                                   .worldSize = world.worldSize, .prefetch = f.prefetch});
  log.info() << "cohort train: " << f.model << " (" << model->params.numel() << " parameters) on " << train->name() << " ("
             << train->size() << " samples" << (test ? ", test " + std::to_string(test->size()) : std::string()) << "), "
             << optimizer->name() << " lr " << f.lr << ", batch " << f.batchSize << ", " << f.threads << " BLAS thread(s)";
  nn::TrainerOptions options;
  options.epochs = f.epochs;
  options.seed = f.seed;
  options.classification = classification;
  options.checkpointPath = f.checkpoint;
  options.checkpointEvery = f.checkpointEvery;
  options.resume = f.resume;
  options.maxSteps = f.maxSteps;
  options.metricsPath = f.metrics;
  nn::Trainer trainer(*model, *optimizer, *loss, loader, test.get(), world, log, options);
  nn::TrainResult result = trainer.run();
  if (world.rank == 0) std::printf("%s\n", trainer.resultLine(result).c_str());
  return 0;
}

}  // namespace cohort::cli
