// checkpoint_async_bench: how long a sharded checkpoint holds training, written synchronously
// against asynchronously (issue 46, item 3: async should block at most 10% of the synchronous
// write). One rank, or several under cohortrun (the world from the environment), at ZeRO stage Z
// over shm, a model of about 100M parameters (default mlp:2048,8192,8192,2048: 100.7M) with AdamW;
// after two training steps, REPEATS interleaved rounds of
//   sync    Job::save(path): pack, write, fsync, commit; the slowest rank's time;
//   async   Job::save(path, {}, {.async = true}): pack and copy to staging; the slowest rank's time
//           (what training waits), then training steps while the write goes on until
//           settleCheckpoint({.wait = false}) commits (the write's time, save to commit, reported).
// Prints per round and then one RESULT line of medians: sync_ms, async_blocked_ms, their ratio,
// async_written_ms, steps_during_write, staging_mib (per rank).
//
//   bazel run //bench:checkpoint_async_bench -- --dir /tmp/ckpt --repeats 3
//   bench/compare_checkpoint_async.sh   (2 workers under cohortrun)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "train/job.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace cohort;

struct Flags {
  std::string model = "mlp:2048,8192,8192,2048";
  std::string dir = "/tmp";
  int zero = 1, repeats = 3, batch = 4;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--model") f.model = value;
    else if (key == "--dir") f.dir = value;
    else if (key == "--zero") f.zero = std::atoi(value.c_str());
    else if (key == "--repeats") f.repeats = std::atoi(value.c_str());
    else if (key == "--batch-size") f.batch = std::atoi(value.c_str());
    else {
      std::fprintf(stderr, "unknown flag %s (--model, --dir, --zero, --repeats, --batch-size)\n", key.c_str());
      std::exit(2);
    }
  }
  return f;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Trainer {
  train::Job& job;
  nn::Model& model;
  runtime::Tensor x, y;
  nn::SoftmaxCrossEntropy loss;
  void step() {
    nn::Pass pass = job.pass();
    loss.forward(model.forward(x, pass), y);
    model.net->backward(loss.backward(), pass);
    job.step();
  }
};

// The slowest rank's seconds since `t0`.
double slowest(train::Job& job, Clock::time_point t0) {
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  job.reduce({&s, 1}, train::Reduce::kMax);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const Flags f = parse(argc, argv);
  train::Job job({.mode = train::Mode::kAllReduce, .backend = train::Backend::kShm,
                  .paramCopies = train::ParamCopies::kReplicas, .zero = f.zero});
  auto model = nn::buildModel(f.model);
  auto optimizer = job.makeOptimizer({.kind = nn::OptimizerKind::kAdamW, .lr = 1e-4f}, *model);
  job.place(*model, *optimizer, {.seed = 1});
  const int64_t in = model->params.entries().front().shape[1];
  Trainer t{job, *model, runtime::Tensor::zeros({f.batch, in}), runtime::Tensor::zeros({f.batch})};
  for (int64_t i = 0; i < t.x.numel(); ++i) t.x.at(i) = static_cast<float>(i % 13) / 13.0f;
  t.step();
  t.step();
  const std::string sync = f.dir + "/bench-sync.ckpt", async = f.dir + "/bench-async.ckpt";
  std::vector<double> syncMs, blockedMs, writtenMs, steps;
  size_t staging = 0;
  const bool lead = job.world().rank == 0;
  for (int round = 0; round < f.repeats; ++round) {
    auto t0 = Clock::now();
    job.save(sync, {{"step", "2"}});
    syncMs.push_back(slowest(job, t0) * 1e3);
    t0 = Clock::now();
    job.save(async, {{"step", "2"}}, {.async = true});
    blockedMs.push_back(slowest(job, t0) * 1e3);
    std::optional<train::CheckpointCommit> commit;
    int during = 0;
    while (!(commit = job.settleCheckpoint({.wait = false}))) {
      t.step();
      ++during;
    }
    writtenMs.push_back(commit->writtenSeconds * 1e3);
    steps.push_back(during);
    staging = commit->stagingBytes;
    if (lead) {
      std::printf("round %d: sync %.1f ms, async blocked %.1f ms (written in %.1f ms, %d steps meanwhile)\n", round,
                  syncMs.back(), blockedMs.back(), writtenMs.back(), during);
    }
  }
  if (lead) {
    std::printf("RESULT bench=checkpoint_async model=%s params=%zu ranks=%d zero=%d sync_ms=%.1f async_blocked_ms=%.1f "
                "ratio=%.3f async_written_ms=%.1f steps_during_write=%.0f staging_mib=%.1f\n",
                f.model.c_str(), model->params.numel(), job.world().worldSize, f.zero, median(syncMs), median(blockedMs),
                median(blockedMs) / median(syncMs), median(writtenMs), median(steps),
                static_cast<double>(staging) / (1 << 20));
  }
  return 0;
}
