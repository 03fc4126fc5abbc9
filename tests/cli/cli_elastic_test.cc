// Elastic resume (docs/checkpoints.md): a checkpoint written by W workers resumes on W' workers.
//   - The loader's rule, in-process: the ranks' batches are a prefix of one global epoch order, and
//     startEpochAfter(e, S) on any W' hands out exactly the positions [S, N) (padded like any epoch),
//     batch for batch what startEpoch(e, k) gives where S = k·W·b.
//   - End to end, by sample ids (COHORT_TEST_SAMPLE_LOG): a 2-worker allreduce run stopped
//     mid-epoch and resumed on 1 and on 3 workers trains every sample of the epoch exactly once,
//     and ends within a tolerance of the uninterrupted run's test accuracy.
//   - ZeRO: a stage-2 checkpoint of 2 workers continues the epoch on 3 workers at stage 3.
//   - Hogwild: a 2-worker checkpoint resumes on 1 and 3 workers with the step counts carried over;
//     the merge/split rule of the per-worker optimizer states, exactly, through the public Job API.
//   - What cannot carry over (Hogwild <-> a lockstep mode, a cosine schedule over another number of
//     steps) exits 2 with one line saying why.
// Every test has its own temporary directory as COHORT_SHM_DIR.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/data/data_loader.h"
#include "runtime/data/dataset.h"
#include "tests/cli/cli_test_support.h"
#include "tests/ipc/multiproc.h"
#include "train/job.h"

namespace cohort::testing {
namespace {

using runtime::data::Batch;
using runtime::data::DataLoader;
using runtime::data::DataLoaderOptions;

// ---- The loader's rule -------------------------------------------------------------------------

// n samples whose single feature is the sample's index.
std::unique_ptr<runtime::data::Dataset> numbered(int64_t n) {
  runtime::data::DatasetContents c;
  c.name = "numbered";
  c.inputs = runtime::Tensor::zeros(runtime::Shape{n, 1});
  c.targets = runtime::Tensor::zeros(runtime::Shape{n});
  c.numClasses = 1;
  for (int64_t i = 0; i < n; ++i) c.inputs.at(i) = static_cast<float>(i);
  return std::make_unique<runtime::data::Dataset>(std::move(c));
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// Every rank of a `ranks`-rank job resumed after `seen` positions: the sample ids of the whole job,
// step by step, checked against the epoch order's positions as it goes (the prefix property).
std::vector<int64_t> resumedJob(const runtime::data::Dataset& d, const DataLoaderOptions& o, int ranks, int64_t seen,
                                const std::vector<int64_t>& order, const std::string& context) {
  std::vector<std::unique_ptr<DataLoader>> loaders;
  for (int r = 0; r < ranks; ++r) {
    DataLoaderOptions mine = o;
    mine.rank = r;
    mine.worldSize = ranks;
    loaders.push_back(std::make_unique<DataLoader>(d, mine));
    loaders.back()->startEpochAfter(3, seen);
  }
  const int64_t first = loaders[0]->firstBatch(), end = loaders[0]->endBatch();
  EXPECT_EQ(first, seen / (ranks * o.batchSize)) << context;
  EXPECT_EQ(loaders[0]->samplesSeenAfter(first - 1), seen) << context;
  std::vector<int64_t> job;
  for (int64_t k = first; k < end; ++k) {
    for (auto& loader : loaders) {
      Batch b;
      EXPECT_TRUE(loader->next(b)) << context << " batch " << k;
      EXPECT_EQ(b.index, k) << context;
      for (int64_t s = 0; s < b.size; ++s) job.push_back(static_cast<int64_t>(b.inputs.at(s)));
    }
    // After step k the job has consumed positions [seen, samplesSeenAfter(k)) of the order.
    const int64_t after = loaders[0]->samplesSeenAfter(k);
    std::vector<int64_t> expected;
    for (int64_t p = seen; p < after; ++p)
      expected.push_back(order[static_cast<size_t>(p % static_cast<int64_t>(order.size()))]);
    EXPECT_EQ(sorted(job), sorted(expected)) << context << " after batch " << k;
  }
  for (auto& loader : loaders) {
    Batch b;
    EXPECT_FALSE(loader->next(b)) << context;
  }
  return job;
}

// For N, W, W' and b swept (N not divisible by them, smaller than W', empty), and every stop
// point of the W-rank job and every S at all: what the W' ranks take is the order's rest, padded at
// its end as an epoch of N - S samples would be; with no padding every sample comes once.
TEST(ElasticLoader, TheRestOfTheEpochOnAnyNumberOfRanksIsExactlyThePositionsNotYetSeen) {
  for (int64_t n : {0, 1, 2, 37, 60}) {
    auto d = numbered(n);
    for (int64_t b : {1, 5}) {
      const DataLoaderOptions o{.batchSize = b, .seed = 9, .prefetch = 1};
      const std::vector<int64_t> order = runtime::data::epochOrder(n, o, 3);
      for (int ranks : {1, 2, 3, 4, 7}) {
        for (int64_t seen = 0; seen <= n; ++seen) {
          const std::string context = "N " + std::to_string(n) + ", b " + std::to_string(b) + ", " +
                                      std::to_string(ranks) + " ranks after " + std::to_string(seen);
          std::vector<int64_t> rest = resumedJob(*d, o, ranks, seen, order, context);
          const int64_t left = n - seen, padded = (left + ranks - 1) / ranks * ranks;
          EXPECT_EQ(static_cast<int64_t>(rest.size()), padded) << context;
          std::vector<int64_t> all(order.begin(), order.begin() + seen);
          all.insert(all.end(), rest.begin(), rest.end());
          std::vector<int64_t> once = sorted(all);
          once.erase(std::unique(once.begin(), once.end()), once.end());
          EXPECT_EQ(static_cast<int64_t>(once.size()), n) << context << ": a sample was skipped";
          if (padded == left) {
            EXPECT_EQ(static_cast<int64_t>(all.size()), n) << context << ": a sample was repeated";
          }
        }
      }
    }
  }
}

// Where S is a whole number of the W-rank job's steps, startEpochAfter is startEpoch at that batch:
// the same samples in the same batches on every rank (a same-size resume stays bit-exact), with
// dropLast too.
TEST(ElasticLoader, AfterWholeStepsItIsStartEpochAtThatBatch) {
  auto d = numbered(53);
  for (bool dropLast : {false, true}) {
    for (int ranks : {1, 2, 3}) {
      for (int r = 0; r < ranks; ++r) {
        DataLoaderOptions o{
            .batchSize = 4, .seed = 2, .rank = r, .worldSize = ranks, .prefetch = 2, .dropLast = dropLast};
        DataLoader a(*d, o), c(*d, o);
        for (int64_t k = 0; k < a.batchesPerEpoch(); ++k) {
          a.startEpoch(1, k);
          c.startEpochAfter(1, k * ranks * 4);
          EXPECT_EQ(c.firstBatch(), k);
          EXPECT_EQ(c.endBatch(), a.batchesPerEpoch());
          for (Batch x, y; a.next(x);) {
            ASSERT_TRUE(c.next(y));
            EXPECT_EQ(x.index, y.index);
            ASSERT_EQ(x.size, y.size);
            for (int64_t s = 0; s < x.size; ++s) EXPECT_EQ(x.inputs.at(s), y.inputs.at(s));
          }
          Batch y;
          EXPECT_FALSE(c.next(y));
        }
      }
    }
  }
  DataLoader loader(*d, {.batchSize = 4});
  EXPECT_THROW(loader.startEpochAfter(0, 54), InvalidArgument);
  EXPECT_THROW(loader.startEpochAfter(0, -1), InvalidArgument);
}

// ---- End to end --------------------------------------------------------------------------------

// How often each sample id was trained on, per epoch, over the files of a COHORT_TEST_SAMPLE_LOG
// directory (lines "EPOCH SAMPLE").
using SampleCounts = std::map<int64_t, std::map<int64_t, int>>;
void addSampleLog(const std::string& dir, SampleCounts& counts) {
  for (const std::string& name : listDir(dir)) {
    std::istringstream lines(readFile(dir + "/" + name));
    for (int64_t epoch, sample; lines >> epoch >> sample;) ++counts[epoch][sample];
  }
}
int64_t total(const std::map<int64_t, int>& counts) {
  int64_t sum = 0;
  for (const auto& [sample, count] : counts) sum += count;
  return sum;
}
// Every one of the n samples exactly once; failures name the first few that were not.
void expectEachOnce(const std::map<int64_t, int>& counts, int64_t n, const std::string& context) {
  int wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    auto it = counts.find(i);
    const int c = it == counts.end() ? 0 : it->second;
    if (c != 1 && ++wrong <= 5) ADD_FAILURE() << context << ": sample " << i << " trained on " << c << " times";
  }
  EXPECT_EQ(wrong, 0) << context;
  EXPECT_EQ(static_cast<int64_t>(counts.size()), n) << context << ": ids outside the data set";
}

constexpr int64_t kSamples = 60000;  // synthetic

class ElasticCliTest : public ShmDirTest {
 protected:
  // `cohort train` on `workers` workers: under cohortrun in `mode`, or alone for one (where the
  // lockstep mode is local); the sample ids logged into `sampleLog` when it is not empty.
  CommandResult train(int workers, const std::string& mode, const std::vector<std::string>& flags,
                      const std::string& sampleLog = "") {
    std::vector<std::string> argv;
    if (workers > 1) {
      argv = {runfile("launcher/cohortrun"), "--nproc-per-node", std::to_string(workers), "--"};
    }
    argv.insert(argv.end(), {cohortBinary(), "train", "--mode", workers == 1 && mode == "allreduce" ? "local" : mode,
                             "--data", "synthetic", "--model", "mlp:784,64,10", "--lr", "0.05", "--momentum", "0.9",
                             "--seed", "5", "--threads", "1"});
    argv.insert(argv.end(), flags.begin(), flags.end());
    CommandOptions options{.timeout = std::chrono::seconds(240)};
    if (!sampleLog.empty()) {
      EXPECT_EQ(::mkdir(sampleLog.c_str(), 0700), 0) << sampleLog;
      options.extraEnvironment = {"COHORT_TEST_SAMPLE_LOG=" + sampleLog};
    }
    return runCommand(argv, options);
  }
  ResultLine expectSuccess(const CommandResult& r) {
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    ResultLine result = parseResultLine(r.stdoutText);
    EXPECT_EQ(result.count, 1) << r.describe();
    return result;
  }
  std::string copyOf(const std::string& from, const std::string& name) {
    writeFile(dir_ + "/" + name, readFile(from));
    return dir_ + "/" + name;
  }
};

// 2 workers × 48 samples take 96 a step: stopped after 100 steps the job has seen 9600 samples of
// epoch 1, not a whole step of 3 workers (144), so the 3 workers start 66 steps in, 2/3 of a step
// past it. The union of what the first run trained and what each resumed run trained in epoch 1 is
// every sample once, and epoch 2 (on the new workers alone) is every sample once. Accuracy: a
// resumed run ends where the uninterrupted run on its number of workers does (0.01; the steps and
// their batches differ only over the first 100 steps), and near the uninterrupted 2-worker run
// (0.04: one worker's 48-sample steps at this learning rate land lower, 0.79 against 0.82).
TEST_F(ElasticCliTest, AllreduceCheckpointOfTwoWorkersContinuesTheEpochOnOneAndThreeWithoutRepeatOrSkip) {
  const std::vector<std::string> common = {"--epochs", "2", "--batch-size", "48"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  std::map<int, double> wholeAcc;
  for (int workers : {1, 2, 3}) {
    const ResultLine whole = expectSuccess(train(workers, "allreduce", common));
    wholeAcc[workers] = whole.number("test_acc");
    EXPECT_GT(wholeAcc[workers], 0.75) << "the uninterrupted run on " << workers << " worker(s) did not learn";
  }

  const std::string stopped = dir_ + "/stopped.st";
  const ResultLine first =
      expectSuccess(train(2, "allreduce", with({"--checkpoint", stopped, "--max-steps", "100"}), dir_ + "/log.first"));
  EXPECT_EQ(first.fields.at("stopped"), "max_steps");
  const nn::Checkpoint ckpt = nn::readCheckpoint(stopped);
  EXPECT_EQ(ckpt.metadata.at("samples_seen"), "9600");
  EXPECT_EQ(ckpt.metadata.at("world_size"), "2");
  SampleCounts before;
  addSampleLog(dir_ + "/log.first", before);
  ASSERT_EQ(before.size(), 1u) << "the first run trained in epoch 1 only";
  EXPECT_EQ(total(before[0]), 9600);

  for (int workers : {1, 3}) {
    const std::string context = "resumed on " + std::to_string(workers) + " worker(s)";
    const std::string log = dir_ + "/log." + std::to_string(workers);
    const CommandResult r =
        train(workers, "allreduce",
              with({"--checkpoint", copyOf(stopped, std::to_string(workers) + ".st"), "--resume"}), log);
    const ResultLine resumed = expectSuccess(r);
    EXPECT_NE(
        r.stdoutText.find("elastic resume: the checkpoint's 2 ranks had seen 9600 of the 60000 samples of epoch 1"),
        std::string::npos)
        << r.describe();
    EXPECT_EQ(resumed.number("world_size"), workers);
    EXPECT_EQ(resumed.number("epochs"), 2);
    SampleCounts counts = before;
    addSampleLog(log, counts);
    expectEachOnce(counts[0], kSamples, context + ", epoch 1");
    SampleCounts after;
    addSampleLog(log, after);
    expectEachOnce(after[1], kSamples, context + ", epoch 2");
    EXPECT_NEAR(resumed.number("test_acc"), wholeAcc[workers], 0.01)
        << context << " against the uninterrupted run on as many";
    EXPECT_NEAR(resumed.number("test_acc"), wholeAcc[2], 0.04) << context << " against the uninterrupted 2-worker run";
  }
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

// ZeRO (issue 46): a sharded checkpoint of 2 workers at stage 2, stopped 100 steps into epoch 1,
// continues the epoch on 3 workers at stage 3 (resharded on load) without repeat or skip.
TEST_F(ElasticCliTest, ZeroCheckpointOfTwoWorkersContinuesTheEpochOnThreeAtAnotherStage) {
  const std::vector<std::string> common = {"--epochs", "1", "--batch-size", "48", "--replicas"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return extra;
  };
  const std::string stopped = dir_ + "/zero.st";
  expectSuccess(train(2, "allreduce", with({"--zero", "2", "--checkpoint", stopped, "--max-steps", "100"}),
                      dir_ + "/zlog.first"));
  EXPECT_EQ(nn::readCheckpoint(stopped).metadata.at("samples_seen"), "9600");
  const CommandResult r =
      train(3, "allreduce", with({"--zero", "3", "--checkpoint", stopped, "--resume"}), dir_ + "/zlog.3");
  const ResultLine resumed = expectSuccess(r);
  EXPECT_NE(r.stdoutText.find("elastic resume: the checkpoint's 2 ranks had seen 9600 of the 60000 samples of epoch 1"),
            std::string::npos)
      << r.describe();
  EXPECT_EQ(resumed.number("world_size"), 3);
  EXPECT_GT(resumed.number("test_acc"), 0.75) << "the resumed ZeRO run did not learn";
  SampleCounts counts;
  addSampleLog(dir_ + "/zlog.first", counts);
  addSampleLog(dir_ + "/zlog.3", counts);
  expectEachOnce(counts[0], kSamples, "stage 2 on 2 workers, then stage 3 on 3");
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

// Hogwild checkpoints at epoch ends: 2 workers' states go on to 1 worker (merged) and to 3 (split).
// Each worker took ceil(30000 / 64) = 469 steps in epoch 1; after epoch 2 every worker's count is
// 469 plus its steps of epoch 2 (60000 / W' samples): the counts carried over, neither reset nor
// summed. Epoch 2 trains every sample once.
TEST_F(ElasticCliTest, HogwildCheckpointOfTwoWorkersResumesOnOneAndThree) {
  const std::string ckpt = dir_ + "/hogwild.st";
  const ResultLine first =
      expectSuccess(train(2, "hogwild", {"--epochs", "1", "--batch-size", "64", "--checkpoint", ckpt}));
  for (int workers : {1, 3}) {
    const std::string context = "resumed on " + std::to_string(workers) + " worker(s)";
    const std::string mine = copyOf(ckpt, "h" + std::to_string(workers) + ".st"),
                      log = dir_ + "/hlog." + std::to_string(workers);
    const ResultLine resumed = expectSuccess(
        train(workers, "hogwild", {"--epochs", "2", "--batch-size", "64", "--checkpoint", mine, "--resume"}, log));
    EXPECT_EQ(resumed.number("world_size"), workers);
    EXPECT_EQ(resumed.number("epochs"), 2);
    // Hogwild's races make accuracy a random variable: a second epoch is no worse than the first
    // by more than that noise.
    EXPECT_GT(resumed.number("test_acc"), first.number("test_acc") - 0.03) << context;
    const nn::Checkpoint after = nn::readCheckpoint(mine);
    const int64_t epoch2Steps = (kSamples / workers + 63) / 64;
    for (int r = 0; r < workers; ++r) {
      EXPECT_EQ(after.metadata.at("optimizer_steps.rank" + std::to_string(r)), std::to_string(469 + epoch2Steps))
          << context << ", worker " << r;
    }
    SampleCounts counts;
    addSampleLog(log, counts);
    EXPECT_EQ(counts.count(0), 0u) << context << ": epoch 1 was done";
    expectEachOnce(counts[1], kSamples, context + ", epoch 2");
  }
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

// The rule for Hogwild's per-worker states, exactly: 3 saved workers with states 3, 6, 9 (plus a
// pattern per element, all exactly representable) and step counts 10, 11, 15. On 1 worker: the
// mean of all (6, 12 steps); on 2: worker 0 the mean of saved 0 and 2 (6, 12.5 -> 13 steps),
// worker 1 saved 1's; on 4: workers 0-2 their own, worker 3 saved 0's.
TEST_F(ElasticCliTest, HogwildStatesAreMergedOrSplitByWorkerNumberModuloTheSmallerCount) {
  const std::string ckpt = dir_ + "/rule.st";
  const int64_t savedSteps[3] = {10, 11, 15};
  auto pattern = [](int64_t i) { return static_cast<float>(i % 4) * 0.25f; };
  // Runs `body(job, optimizer, rank)` on `workers` forked ranks of a fresh Hogwild job.
  auto onWorkers = [&](int workers, const std::function<int(train::Job&, nn::Optimizer&, int)>& body) {
    const std::string jobId = ipc::testing::freshJobId();
    std::vector<pid_t> children;
    for (int r = 0; r < workers; ++r) {
      runtime::WorldInfo world{.rank = r,
                               .worldSize = workers,
                               .localRank = r,
                               .localWorldSize = workers,
                               .jobId = jobId,
                               .source = workers > 1 ? "test" : "single"};
      children.push_back(ipc::testing::forkChild([=] {
        auto model = nn::buildModel("mlp:6,5,3");
        auto optimizer = nn::makeOptimizer({.lr = 0.05f, .momentum = 0.9f}, model->params.numel());
        train::Job job({.mode = train::Mode::kHogwild}, world);
        job.place(*model, *optimizer, {.seed = 3});
        return body(job, *optimizer, r);
      }));
    }
    for (int r = 0; r < workers; ++r) {
      EXPECT_EQ(ipc::testing::waitChild(children[static_cast<size_t>(r)], std::chrono::seconds(60)), 0)
          << workers << " workers, rank " << r;
    }
  };
  onWorkers(3, [&](train::Job& job, nn::Optimizer& optimizer, int rank) {
    const runtime::Tensor state = optimizer.state().at(0).tensor;  // a view of the optimizer's
    for (int64_t i = 0; i < state.numel(); ++i) state.data()[i] = static_cast<float>(3 * (rank + 1)) + pattern(i);
    optimizer.setSteps(savedSteps[rank]);
    job.save(ckpt);
    return 0;
  });
  // Worker r of `workers` expects state `value` (+ pattern) and `steps`.
  auto expectLoaded = [&](int workers, const std::function<std::pair<float, int64_t>(int)>& want) {
    onWorkers(workers, [&](train::Job& job, nn::Optimizer& optimizer, int rank) {
      if (!job.load(ckpt)) return 30;
      const auto [value, steps] = want(rank);
      const runtime::Tensor state = optimizer.state().at(0).tensor;
      for (int64_t i = 0; i < state.numel(); ++i) {
        if (state.data()[i] != value + pattern(i)) {
          std::fprintf(stderr, "worker %d of %d: element %lld is %g, want %g\n", rank, workers,
                       static_cast<long long>(i), state.data()[i], value + pattern(i));
          return 31;
        }
      }
      if (optimizer.steps() != steps) {
        std::fprintf(stderr, "worker %d of %d: %lld steps, want %lld\n", rank, workers,
                     static_cast<long long>(optimizer.steps()), static_cast<long long>(steps));
        return 32;
      }
      return 0;
    });
  };
  expectLoaded(1, [](int) { return std::pair<float, int64_t>{6.0f, 12}; });
  expectLoaded(2, [](int r) {
    return r == 0 ? std::pair<float, int64_t>{6.0f, 13} : std::pair<float, int64_t>{6.0f, 11};
  });
  expectLoaded(3, [&](int r) { return std::pair<float, int64_t>{3.0f * static_cast<float>(r + 1), savedSteps[r]}; });
  expectLoaded(4, [&](int r) {
    const int from = r % 3;
    return std::pair<float, int64_t>{3.0f * static_cast<float>(from + 1), savedSteps[from]};
  });
}

// Refused, each with exit code 2 and one line on stderr that says why: a Hogwild checkpoint in a
// lockstep mode and the other way round (per-worker states against one for the job), and a cosine
// schedule resumed on another number of ranks (it spans the run's steps, which change with them).
TEST_F(ElasticCliTest, WhatCannotCarryOverIsRefusedWithExitCode2AndOneLine) {
  auto expectRefused = [&](const CommandResult& r, const std::string& why) {
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_EQ(countLines(r.stderrText), 1) << r.describe();
    EXPECT_NE(r.stderrText.find(why), std::string::npos) << r.describe();
    EXPECT_EQ(r.stdoutText.find("RESULT"), std::string::npos) << r.describe();
  };
  const std::string lockstep = dir_ + "/lockstep.st", hogwild = dir_ + "/hogwild.st";
  const std::vector<std::string> small = {"--batch-size", "64", "--epochs", "1"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), small.begin(), small.end());
    return extra;
  };
  expectSuccess(train(2, "allreduce", with({"--checkpoint", lockstep, "--max-steps", "5"})));
  expectRefused(
      train(1, "hogwild", with({"--checkpoint", lockstep, "--resume"})),
      "written by an allreduce job of 2 ranks, and this is a hogwild job of 1 rank: Hogwild keeps an optimizer "
      "state per worker, the other modes one for the job");
  // A Hogwild checkpoint of one worker, written by a job started alone (no cohortrun).
  {
    std::vector<std::string> argv = {
        cohortBinary(), "train",      "--mode", "hogwild", "--data", "synthetic", "--model", "mlp:784,64,10", "--lr",
        "0.05",         "--momentum", "0.9",    "--seed",  "5",      "--threads", "1",       "--checkpoint",  hogwild};
    argv.insert(argv.end(), small.begin(), small.end());
    expectSuccess(runCommand(argv, {.timeout = std::chrono::seconds(120)}));
  }
  expectRefused(
      train(1, "allreduce", with({"--checkpoint", hogwild, "--resume"})),
      "written by a hogwild job of 1 rank, and this is a local job of 1 rank: Hogwild keeps an optimizer state "
      "per worker");
  const std::vector<std::string> cosine = {"--lr-schedule", "cosine", "--warmup-steps", "2"};
  const std::string scheduled = dir_ + "/cosine.st";
  std::vector<std::string> flags = with({"--checkpoint", scheduled, "--max-steps", "5"});
  flags.insert(flags.end(), cosine.begin(), cosine.end());
  expectSuccess(train(2, "allreduce", flags));
  flags = with({"--checkpoint", scheduled, "--resume"});
  flags.insert(flags.end(), cosine.begin(), cosine.end());
  expectRefused(train(1, "allreduce", flags),
                "checkpoint was written by 2 ranks and this job has 1: the cosine schedule spans the run's optimizer "
                "steps, whose number depends on the number of ranks");
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

}  // namespace
}  // namespace cohort::testing
