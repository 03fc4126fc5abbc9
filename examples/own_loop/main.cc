// own_loop: a user's own training loop over Cohort's Job, DDP-style — forward, loss, backward, then
// one call that synchronises and steps — with K micro-batches per step (gradients accumulated
// without synchronising; only the last micro-batch's backward starts the all-reduce) and a
// checkpoint of the whole job that the loop resumes from.
//
//   cohortrun --nproc-per-node 2 -- own_loop --mode allreduce --micro-batches 4 --batch 16 \
//       --steps 20 --checkpoint /tmp/own.st                           # shm, one node
//   mpirun -np 2 own_loop --mode allreduce --backend mpi ...           # Open MPI, any nodes
//
// It trains a built-in model (--model, the reference MLP by default) on docs/data.md's synthetic
// MNIST-shaped set. K micro-batches of b samples per rank and step equal `cohort train
// --batch-size K·b --max-steps N` with the same seed (to 1e-5; tests/examples check it), and it
// runs at the Trainer's speed (bench/compare_own_loop.sh). Prints one RESULT line on rank 0.
#include <CLI/CLI.hpp>  // flags
#include <chrono>
#include <cstdio>
#include <string>

#include "cohort/cohort.h"  // the public API: train::Job, nn, data

namespace {

using namespace cohort;

struct Flags {
  std::string mode = "local", backend, model = "mlp:784,64,10", checkpoint;
  int64_t batch = 16, microBatches = 1, steps = 100;
  double lr = 0.05, momentum = 0.9;
  uint64_t seed = 0;
  bool resume = false;
};

int run(const Flags& f) {
  train::Job job({.mode = train::parseMode(f.mode), .backend = train::parseBackend(f.backend)});
  auto data = runtime::data::openDataset("synthetic", runtime::data::Split::kTrain);
  auto model = nn::buildModel(f.model);
  auto optimizer = nn::makeOptimizer({.lr = static_cast<float>(f.lr), .momentum = static_cast<float>(f.momentum)},
                                     model->params.numel(), job.gpu());
  job.place(*model, *optimizer, {.seed = f.seed});  // initialised like `cohort train --seed`

  // Resume: the job restores parameters and optimizer state; the loop keeps its own position.
  int64_t step = 0;
  const nn::Metadata mustMatch = {{"micro_batch", std::to_string(f.batch)},
                                  {"micro_batches", std::to_string(f.microBatches)}};
  if (f.resume) {
    if (auto meta = job.load(f.checkpoint, mustMatch)) step = std::stoll(meta->at("step"));
  }

  runtime::data::DataLoader loader(*data, job.dataSplit({.batchSize = f.batch, .seed = f.seed}));
  nn::SoftmaxCrossEntropy loss;
  int64_t next = step * f.microBatches;  // the micro-batch to train next, counted over the epochs
  int64_t epoch = next / loader.batchesPerEpoch();
  loader.startEpoch(epoch, next % loader.batchesPerEpoch());
  double lossSum = 0;
  int64_t samples = 0;
  const auto start = std::chrono::steady_clock::now();
  for (; step < f.steps; ++step) {
    for (int k = 0; k < f.microBatches; ++k) {
      runtime::data::Batch b;
      while (!loader.next(b)) loader.startEpoch(++epoch);
      nn::Pass pass = job.pass({.microBatch = k, .microBatches = static_cast<int>(f.microBatches)});
      lossSum += loss.forward(model->forward(b.inputs, pass), b.targets) * static_cast<double>(b.size);
      samples += b.size;
      model->backward(loss.backward(), pass);
    }
    job.step();  // all-reduce (or shared update), then the optimizer; gradients averaged over the K
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!f.checkpoint.empty()) {
    nn::Metadata position = mustMatch;
    position["step"] = std::to_string(step);
    job.save(f.checkpoint, position);
  }
  // The job's figures: mean loss over the ranks, and samples per second of all ranks together.
  double figures[2] = {samples ? lossSum / static_cast<double>(samples) : 0, seconds > 0 ? samples / seconds : 0};
  job.reduce({figures, 1}, train::Reduce::kMean);
  job.reduce({figures + 1, 1}, train::Reduce::kSum);
  if (job.world().rank == 0) {
    std::printf(
        "RESULT example=own_loop mode=%s backend=%s world_size=%d steps=%lld train_loss=%.6f samples_per_s=%.0f\n",
        f.mode.c_str(), job.backend().c_str(), job.world().worldSize, static_cast<long long>(step), figures[0],
        figures[1]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"own_loop: a user's own training loop with gradient accumulation and checkpoints"};
  app.add_option("--mode", f.mode, "local | hogwild | allreduce")->capture_default_str();
  app.add_option("--backend", f.backend, "allreduce backend: shm | mpi | nccl");
  app.add_option("--model", f.model, "built-in model spec")->capture_default_str();
  app.add_option("--batch", f.batch, "samples per micro-batch and rank")->capture_default_str();
  app.add_option("--micro-batches", f.microBatches, "micro-batches per optimizer step (K)")->capture_default_str();
  app.add_option("--steps", f.steps, "optimizer steps in all")->capture_default_str();
  app.add_option("--lr", f.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--momentum", f.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--seed", f.seed, "initialisation and shuffling")->capture_default_str();
  app.add_option("--checkpoint", f.checkpoint, "checkpoint written at the end");
  app.add_flag("--resume", f.resume, "continue from --checkpoint if it exists");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return cohort::runMain("own_loop: ", [&] { return run(f); });
}
