// train::Job in process: every mode and strategy driven through the public API by ranks that are
// forked processes of this test (no `cohort` binary), each with a fresh job id and shared-memory
// directory.
//   - allreduce (one shared copy per node over shm, and replicas over shm): N ranks x batch b train like 1 rank x batch
//     N·b (to 1e-5 after 12 steps), with and without K micro-batches per step;
//   - K micro-batches of b equal one batch of K·b in one process;
//   - a checkpoint saved mid-run and loaded into a fresh job continues bit for bit (local, shared copy,
//     replicas), and Hogwild restores every worker's own optimizer state;
//   - Hogwild workers see one copy of the parameters;
//   - clipping by global norm: a case by hand, and N ranks (shared copy, replicas) clip the averaged
//     gradient like 1 rank with the combined batch (to 1e-5 after 20 clipped steps);
//   - a non-finite loss (any rank's) or gradient is applied nowhere, and every rank says which;
//   - misuse is an InvalidArgument naming the problem.
#include "train/job.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/activation.h"
#include "nn/checkpoint.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/data/data_loader.h"
#include "runtime/data/dataset.h"
#include "tests/support/process.h"
#include "tests/train/ranks.h"

namespace cohort::train {
namespace {

using ipc::testing::ScopedShmDir;
using runtime::Shape;
using runtime::Tensor;
using runtime::data::Dataset;
using testing::runRanks;

constexpr const char* kSpec = "mlp:20,16,3";

struct Run {
  JobOptions job;
  int64_t batch = 16;  // per rank and micro-batch
  int microBatches = 1;
  int64_t expectReductions = -1;  // >= 0: the job's gradientReductions() at the end must be this
  int64_t steps = 12;
  float clip = 0;  // > 0: clip every step's gradient to this norm, and most steps must need it
  nn::OptimizerKind optimizer = nn::OptimizerKind::kSgd;
  std::string saveAt;  // checkpoint path written after `saveAfter` steps
  int64_t saveAfter = -1;
  std::string resumeFrom;  // checkpoint to load before training (its "step" says where to start)
  std::string finalPath;   // checkpoint written at the end
};

// One rank's training loop through the public API; returns 0 or a failure code.
int trainRank(const Run& run, const runtime::WorldInfo& world) {
  auto data = testing::teacherData();
  auto model = nn::buildModel(kSpec);
  Job job(run.job, world);
  auto optimizer =
      nn::makeOptimizer({.kind = run.optimizer, .lr = 0.05f, .momentum = 0.9f}, model->params.numel(), job.gpu());
  job.place(*model, *optimizer, {.seed = 3});
  int64_t step = 0;
  if (!run.resumeFrom.empty()) {
    auto meta = job.load(run.resumeFrom);
    if (!meta) return 10;
    step = std::stoll(meta->at("step"));
  }
  runtime::data::DataLoader loader(*data, job.dataSplit({.batchSize = run.batch, .seed = 7, .prefetch = 0}));
  nn::SoftmaxCrossEntropy loss;
  // Batches in order from `step` on: micro-batch k of step s is batch s·K + k of the epochs' stream.
  int64_t next = step * run.microBatches;
  int64_t epoch = next / loader.batchesPerEpoch();
  loader.startEpoch(epoch, next % loader.batchesPerEpoch());
  int64_t clipped = 0;
  for (; step < run.steps;) {
    for (int k = 0; k < run.microBatches; ++k) {
      runtime::data::Batch b;
      if (!loader.next(b)) {
        loader.startEpoch(++epoch);
        if (!loader.next(b)) return 11;
      }
      nn::Pass pass = job.pass({.microBatch = k, .microBatches = run.microBatches});
      loss.forward(model->forward(b.inputs, pass), b.targets);
      model->backward(loss.backward(), pass);
    }
    const StepResult result = job.step({.clipGradNorm = run.clip});
    if (!result.applied) return 52;
    if (result.gradNorm > run.clip) ++clipped;
    ++step;
    if (step == run.saveAfter) job.save(run.saveAt, {{"step", std::to_string(step)}});
  }
  if (!run.finalPath.empty()) job.save(run.finalPath, {{"step", std::to_string(step)}});
  // Accumulation synchronises once per step: one reduction per step and bucket, whatever K.
  if (run.expectReductions >= 0 && job.gradientReductions() != static_cast<uint64_t>(run.expectReductions)) {
    std::fprintf(stderr, "%llu gradient reductions, expected %lld\n",
                 static_cast<unsigned long long>(job.gradientReductions()),
                 static_cast<long long>(run.expectReductions));
    return 50;
  }
  if (run.clip > 0 && clipped < run.steps / 2) {
    std::fprintf(stderr, "only %lld of %lld steps were clipped\n", static_cast<long long>(clipped),
                 static_cast<long long>(run.steps));
    return 51;
  }
  job.barrier("done");
  return 0;
}

void train(int ranks, const Run& run) {
  runRanks(ranks, [&](const runtime::WorldInfo& world) { return trainRank(run, world); });
}

// The largest difference between the parameters of two checkpoints (every parameter present in both).
double worstDifference(const std::string& a, const std::string& b) {
  nn::Checkpoint x = nn::readCheckpoint(a), y = nn::readCheckpoint(b);
  auto model = nn::buildModel(kSpec);
  double worst = 0;
  for (const auto& e : model->params.entries()) {
    const Tensor* p = x.find(e.name);
    const Tensor* q = y.find(e.name);
    if (!p || !q || p->numel() != q->numel()) return INFINITY;
    for (int64_t i = 0; i < p->numel(); ++i) worst = std::max(worst, std::fabs(double(p->at(i)) - q->at(i)));
  }
  return worst;
}

bool sameBits(const std::string& a, const std::string& b) {
  nn::Checkpoint x = nn::readCheckpoint(a), y = nn::readCheckpoint(b);
  if (x.tensors.size() != y.tensors.size()) return false;
  for (size_t i = 0; i < x.tensors.size(); ++i) {
    const Tensor& p = x.tensors[i].tensor;
    const Tensor* q = y.find(x.tensors[i].name);
    if (!q || q->numel() != p.numel() || std::memcmp(p.data(), q->data(), p.bytes()) != 0) return false;
  }
  return true;
}

class JobTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = cohort::testing::freshTempDir(); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  ScopedShmDir shm_;
  std::string dir_;
};

JobOptions allreduce(bool replicas) {
  return {.mode = Mode::kAllReduce,
          .backend = Backend::kShm,
          .paramCopies = replicas ? ParamCopies::kReplicas : ParamCopies::kSharedPerNode};
}

TEST_F(JobTest, SharedCopyRanksTrainLikeOneRankWithTheirCombinedBatch) {
  for (int ranks : {2, 3}) {
    train(1, {.batch = 16 * ranks, .finalPath = path("one.st")});
    train(ranks, {.job = allreduce(false), .finalPath = path("many.st")});
    EXPECT_LE(worstDifference(path("one.st"), path("many.st")), 1e-5) << ranks << " ranks";
  }
}

TEST_F(JobTest, ReplicasTrainLikeOneRankWithTheirCombinedBatch) {
  train(1, {.batch = 32, .optimizer = nn::OptimizerKind::kAdam, .finalPath = path("one.st")});
  train(2, {.job = allreduce(true), .optimizer = nn::OptimizerKind::kAdam, .finalPath = path("many.st")});
  EXPECT_LE(worstDifference(path("one.st"), path("many.st")), 1e-5);
}

TEST_F(JobTest, MicroBatchesAccumulateLikeOneBatch) {
  train(1, {.batch = 32, .finalPath = path("whole.st")});
  train(1, {.batch = 8, .microBatches = 4, .finalPath = path("micro.st")});
  EXPECT_LE(worstDifference(path("whole.st"), path("micro.st")), 1e-5);
  // With workers: 2 ranks x 2 micro-batches of 8 = one batch of 32 (shared copy and replicas).
  train(
      2,
      {.job = allreduce(false), .batch = 8, .microBatches = 2, .expectReductions = 12, .finalPath = path("shared.st")});
  EXPECT_LE(worstDifference(path("whole.st"), path("shared.st")), 1e-5);
  train(2, {.job = allreduce(true),
            .batch = 8,
            .microBatches = 2,
            .expectReductions = 12,
            .finalPath = path("replicas.st")});
  EXPECT_LE(worstDifference(path("whole.st"), path("replicas.st")), 1e-5);
}

// Issue 16: the averaged gradient is clipped, its norm the same on every rank: 2 and 3 ranks (the
// shared-copy shm path, whose ranks each update a slice of it, and replicas) after 20 clipped steps equal
// one rank with the combined batch. Hogwild clips each worker's own gradient.
TEST_F(JobTest, RanksClipTheAveragedGradientLikeOneRankWithTheCombinedBatch) {
  for (int ranks : {2, 3}) {
    train(1, {.batch = 16 * ranks, .steps = 20, .clip = 0.1f, .finalPath = path("one.st")});
    train(ranks, {.job = allreduce(false), .steps = 20, .clip = 0.1f, .finalPath = path("shared.st")});
    EXPECT_LE(worstDifference(path("one.st"), path("shared.st")), 1e-5) << ranks << " ranks, shared copy";
    train(ranks, {.job = allreduce(true), .steps = 20, .clip = 0.1f, .finalPath = path("replicas.st")});
    EXPECT_LE(worstDifference(path("one.st"), path("replicas.st")), 1e-5) << ranks << " ranks, replicas";
  }
  // The clipping changed the outcome.
  train(1, {.batch = 32, .steps = 20, .finalPath = path("unclipped.st")});
  train(1, {.batch = 32, .steps = 20, .clip = 0.1f, .finalPath = path("clipped.st")});
  EXPECT_GT(worstDifference(path("unclipped.st"), path("clipped.st")), 1e-3);
  // A Hogwild worker clips its own gradient: alone, exactly like a local run.
  train(1, {.job = {.mode = Mode::kHogwild}, .batch = 32, .steps = 20, .clip = 0.1f, .finalPath = path("hogwild.st")});
  EXPECT_EQ(worstDifference(path("clipped.st"), path("hogwild.st")), 0.0);
}

// y = w·x + b (mlp:2,1) from zeros, placed on `job` with SGD at lr 1, and the sample x = (1, 2),
// target 5: steps small enough to follow by hand.
struct Line {
  std::unique_ptr<nn::Model> model = nn::buildModel("mlp:2,1");
  std::unique_ptr<nn::Optimizer> optimizer;
  Tensor x = Tensor::zeros(Shape{1, 2}), t = Tensor::zeros(Shape{1, 1});

  explicit Line(Job& job) {
    optimizer = nn::makeOptimizer({.lr = 1.0f}, model->params.numel());
    job.place(*model, *optimizer, {.initialise = [](nn::Model& m) { m.params.values().fill(0.0f); }});
    x.at(0) = 1;
    x.at(1) = 2;
    t.at(0) = 5;
  }
};

// clip_grad_norm_ by hand: y = w·x + b from zeros, x = (1, 2), target 5, squared error: dL/dy = -10,
// so the gradient is (-10, -20) for w and -10 for b, norm sqrt(600); clipped to 1 and applied with
// lr 1, the parameters become 10c, 20c and 10c for c = 1 / (sqrt(600) + 1e-6).
TEST_F(JobTest, ClippingByHand) {
  runRanks(1, [&](const runtime::WorldInfo& world) {
    Job job({}, world);
    Line line(job);
    nn::Model* model = line.model.get();
    const Tensor &x = line.x, &t = line.t;
    nn::MeanSquaredError loss;
    nn::Pass pass = job.pass();
    const double l = loss.forward(model->forward(x, pass), t);
    model->backward(loss.backward(), pass);
    const StepResult r = job.step({.clipGradNorm = 1.0f, .loss = l});
    if (!r.applied || std::fabs(r.gradNorm - std::sqrt(600.0)) > 1e-5) return 30;
    const double c = 1.0 / (std::sqrt(600.0) + 1e-6);
    const auto& entries = model->params.entries();
    for (size_t i = 0; i < entries.size(); ++i) {
      const Tensor v = model->params.value(i);
      const std::vector<double> want = entries[i].name.find("weight") != std::string::npos
                                           ? std::vector<double>{10 * c, 20 * c}
                                           : std::vector<double>{10 * c};
      if (v.numel() != static_cast<int64_t>(want.size())) return 31;
      for (int64_t k = 0; k < v.numel(); ++k) {
        if (std::fabs(v.at(k) - want[static_cast<size_t>(k)]) > 1e-6) {
          std::fprintf(stderr, "%s[%lld] = %.9g, want %.9g\n", entries[i].name.c_str(), static_cast<long long>(k),
                       v.at(k), want[static_cast<size_t>(k)]);
          return 32;
        }
      }
    }
    return 0;
  });
}

// What one rank's step does with a planted non-finite value; 0 when every rank saw what it should.
int nonFiniteSteps(const JobOptions& options, const runtime::WorldInfo& world) {
  auto data = testing::teacherData();
  auto model = nn::buildModel(kSpec);
  Job job(options, world);
  auto optimizer = nn::makeOptimizer({.lr = 0.05f, .momentum = 0.9f}, model->params.numel());
  job.place(*model, *optimizer, {.seed = 3});
  runtime::data::DataLoader loader(*data, job.dataSplit({.batchSize = 16, .seed = 7, .prefetch = 0}));
  nn::SoftmaxCrossEntropy loss;
  loader.startEpoch(0);
  const int last = world.worldSize - 1;
  const bool hogwild = options.mode == Mode::kHogwild;
  // plant: 0 nothing, 1 the last rank's loss is NaN, 2 rank 0's gradient is non-finite.
  auto step = [&](int plant) {
    runtime::data::Batch b;
    loader.next(b);
    nn::Pass pass = job.pass();
    double l = loss.forward(model->forward(b.inputs, pass), b.targets);
    // Into the loss's gradient, before backward (whose bucket all-reduces may be running already).
    const Tensor& dloss = loss.backward();
    if (plant == 2 && world.rank == 0) const_cast<Tensor&>(dloss).at(0) = INFINITY;
    model->backward(dloss, pass);
    if (plant == 1 && world.rank == last) l = std::nan("");
    return job.step({.loss = l});
  };
  if (!step(0).applied) return 60;
  job.barrier("first step");
  const Tensor before = model->params.values().clone();
  const int64_t steps = optimizer->steps();
  const Tensor state = optimizer->state()[0].tensor.clone();
  job.barrier("saved");
  StepResult r = step(1);
  if (hogwild) {  // each worker judges its own step
    if (r.applied != (world.rank != last) || (!r.applied && (r.nonFinite != NonFinite::kLoss || r.rank != last)))
      return 61;
    return 0;
  }
  if (r.applied || r.nonFinite != NonFinite::kLoss || r.rank != last) return 62;
  if (r.describe().find("loss is non-finite on rank " + std::to_string(last)) == std::string::npos) return 63;
  r = step(2);
  if (r.applied || r.nonFinite != NonFinite::kGradient || r.rank != (world.worldSize == 1 ? 0 : -1) ||
      std::isfinite(r.gradNorm)) {
    return 64;
  }
  job.barrier("skipped");
  // Nothing was applied: parameters, optimizer state and step count as before.
  if (std::memcmp(before.data(), model->params.values().data(), before.bytes()) != 0) return 65;
  if (optimizer->steps() != steps) return 66;
  if (std::memcmp(state.data(), optimizer->state()[0].tensor.data(), state.bytes()) != 0) return 67;
  r = step(0);
  if (!r.applied || !std::isfinite(r.gradNorm) || r.gradNorm <= 0) return 68;
  job.barrier("stepped");
  if (std::memcmp(before.data(), model->params.values().data(), before.bytes()) == 0) return 69;
  return 0;
}

TEST_F(JobTest, ANonFiniteLossOrGradientIsAppliedNowhereAndEveryRankSaysWhich) {
  runRanks(1, [&](const runtime::WorldInfo& world) { return nonFiniteSteps({}, world); });
  for (int ranks : {2, 3}) {
    runRanks(ranks, [&](const runtime::WorldInfo& world) { return nonFiniteSteps(allreduce(false), world); });
    runRanks(ranks, [&](const runtime::WorldInfo& world) { return nonFiniteSteps(allreduce(true), world); });
  }
  runRanks(2, [&](const runtime::WorldInfo& world) { return nonFiniteSteps({.mode = Mode::kHogwild}, world); });
}

TEST_F(JobTest, ACheckpointContinuesBitForBitInEveryLockstepMode) {
  struct Case {
    const char* name;
    int ranks;
    JobOptions job;
  };
  for (const Case& c :
       {Case{"local", 1, {}}, Case{"shared copy", 2, allreduce(false)}, Case{"replicas", 2, allreduce(true)}}) {
    const std::string whole = path(std::string(c.name) + "-whole.st"), half = path(std::string(c.name) + "-half.st"),
                      resumed = path(std::string(c.name) + "-resumed.st");
    for (auto kind : {nn::OptimizerKind::kSgd, nn::OptimizerKind::kAdam}) {
      train(c.ranks, {.job = c.job, .optimizer = kind, .saveAt = half, .saveAfter = 5, .finalPath = whole});
      train(c.ranks, {.job = c.job, .optimizer = kind, .resumeFrom = half, .finalPath = resumed});
      EXPECT_TRUE(sameBits(whole, resumed)) << c.name;
    }
  }
}

// Hogwild: what one worker writes, the others read (one copy); each worker's own optimizer state
// (momentum differs per worker) comes back from the checkpoint to the worker that saved it.
TEST_F(JobTest, HogwildWorkersShareOneCopyAndGetTheirOwnOptimizerStateBack) {
  const std::string ckpt = path("hogwild.st");
  runRanks(3, [&](const runtime::WorldInfo& world) {
    auto data = testing::teacherData();
    auto model = nn::buildModel(kSpec);
    Job job({.mode = Mode::kHogwild}, world);
    auto optimizer = nn::makeOptimizer({.lr = 0.05f, .momentum = 0.9f}, model->params.numel());
    job.place(*model, *optimizer, {.seed = 3});
    if (job.lockstep()) return 20;
    runtime::data::DataLoader loader(*data, job.dataSplit({.batchSize = 16, .seed = 7, .prefetch = 0}));
    nn::SoftmaxCrossEntropy loss;
    loader.startEpoch(0);
    for (runtime::data::Batch b; loader.next(b);) {
      nn::Pass pass = job.pass();
      loss.forward(model->forward(b.inputs, pass), b.targets);
      model->backward(loss.backward(), pass);
      job.step();
    }
    job.barrier("trained");
    // One copy: rank 1 writes a marker, everyone reads it.
    if (world.rank == 1) model->params.values().at(0) = 1234.5f;
    job.barrier("marked");
    if (model->params.values().at(0) != 1234.5f) return 21;
    job.save(ckpt);
    const Tensor mine = optimizer->state()[0].tensor.clone();
    const int64_t steps = optimizer->steps();
    optimizer->state()[0].tensor.fill(0.0f);
    optimizer->setSteps(0);
    job.barrier("cleared");
    if (!job.load(ckpt)) return 22;
    if (std::memcmp(mine.data(), optimizer->state()[0].tensor.data(), mine.bytes()) != 0) return 23;
    if (optimizer->steps() != steps) return 24;
    if (model->params.values().at(0) != 1234.5f) return 25;
    return 0;
  });
  nn::Checkpoint c = nn::readCheckpoint(ckpt);
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(c.find("optimizer.rank" + std::to_string(r) + ".momentum_buffer"), nullptr) << r;
    EXPECT_EQ(c.metadata.count("optimizer_steps.rank" + std::to_string(r)), 1u) << r;
  }
}

// What an error says, or "" when `f` did not throw InvalidArgument.
std::string invalidArgument(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// The deferred form on the CPU: the step runs at once, its result waits for settleStep() in step
// order, the schedule's learning rate is the one for the optimizer's count; a synchronous step, a
// third deferred one and save() are refused while results are pending.
TEST_F(JobTest, DeferredResultsComeInStepOrderFromSettleStep) {
  runRanks(1, [&](const runtime::WorldInfo& world) {
    Job job({}, world);
    Line line(job);
    nn::Optimizer* optimizer = line.optimizer.get();
    nn::MeanSquaredError loss;
    auto backward = [&](float x1) {
      line.x.at(1) = x1;
      nn::Pass pass = job.pass();
      loss.forward(line.model->forward(line.x, pass), line.t);
      line.model->backward(loss.backward(), pass);
    };
    const auto lrAt = [](int64_t steps) { return 0.25f / static_cast<float>(steps + 1); };
    backward(2);
    if (!job.step({.lrAt = lrAt, .deferResult = true}).pending || job.pendingSteps() != 1) return 30;
    if (optimizer->options().lr != 0.25f) return 31;
    backward(NAN);
    if (!job.step({.lrAt = lrAt, .deferResult = true}).pending || job.pendingSteps() != 2) return 32;
    backward(2);
    if (invalidArgument([&] { job.step({.deferResult = true}); }).find("pending") == std::string::npos) return 33;
    if (invalidArgument([&] { job.step(); }).find("settleStep") == std::string::npos) return 34;
    if (invalidArgument([&] { job.save(path("pending.st")); }).find("pending") == std::string::npos) return 35;
    const std::optional<StepResult> first = job.settleStep(), second = job.settleStep();
    if (!first || !first->applied || first->pending) return 36;
    if (!second || second->applied || second->nonFinite != NonFinite::kGradient) return 37;
    if (job.settleStep() || job.pendingSteps() != 0 || optimizer->steps() != 1) return 38;
    if (!job.step({.lrAt = lrAt}).applied || optimizer->options().lr != 0.125f) return 39;
    return 0;
  });
}

// Misuse of one job: a wrong optimizer, steps out of order, a second placement or Job, a clipping
// norm that is no norm; saves a checkpoint at `ckpt` for the checks on loading it.
int misuseOneJob(const runtime::WorldInfo& world, const std::string& ckpt) {
  auto model = nn::buildModel(kSpec);
  auto other = nn::buildModel("mlp:20,8,3");
  Job job({}, world);
  // An optimizer made for another model.
  auto wrongSize = nn::makeOptimizer({.lr = 0.1f}, other->params.numel());
  if (invalidArgument([&] { job.place(*model, *wrongSize); }).find("made for") == std::string::npos) return 30;
  // Before place(): nothing to step.
  if (invalidArgument([&] { job.step(); }).find("place()") == std::string::npos) return 31;
  auto optimizer = nn::makeOptimizer({.lr = 0.1f, .momentum = 0.9f}, model->params.numel());
  job.place(*model, *optimizer);
  // A second model (or the same again) after the job placed its parameters.
  auto otherOptimizer = nn::makeOptimizer({.lr = 0.1f}, other->params.numel());
  if (invalidArgument([&] { job.place(*other, *otherOptimizer); }).find("already placed") == std::string::npos)
    return 32;
  // A parameter registered after placing.
  Tensor v, g;
  if (invalidArgument([&] { model->params.add("late.weight", Shape{2}, &v, &g); }).find("late.weight") ==
      std::string::npos) {
    return 33;
  }
  // Two jobs in one process.
  if (invalidArgument([&] { Job second({}, world); }).find("already exists") == std::string::npos) return 34;
  // step() without the backward of the last micro-batch.
  job.pass({.microBatch = 0, .microBatches = 2});
  if (invalidArgument([&] { job.step(); }).find("last micro-batch") == std::string::npos) return 35;
  if (invalidArgument([&] { job.pass({.microBatch = 2, .microBatches = 2}); }).find("micro-batch") ==
      std::string::npos) {
    return 36;
  }
  // A clipping norm that is no norm.
  job.pass();
  if (invalidArgument([&] { job.step({.clipGradNorm = -1}); }).find("clipGradNorm") == std::string::npos) return 37;
  if (invalidArgument([&] { job.step({.clipGradNorm = NAN}); }).find("clipGradNorm") == std::string::npos) return 38;
  job.save(ckpt);
  return 0;
}

// Misuse, one process. Runs in a child so that no GEMM thread pool exists in the test process when
// the other tests fork.
TEST_F(JobTest, MisuseIsAnInvalidArgumentNamingTheProblem) {
  const std::string ckpt = path("mlp.st");
  runRanks(1, [&](const runtime::WorldInfo& world) { return misuseOneJob(world, ckpt); });
  runRanks(1, [&](const runtime::WorldInfo& world) {
    // A checkpoint of another model: another name, or the same name with other shapes.
    auto other = nn::buildModel("mlp:20,8,3");
    Job job({}, world);
    auto optimizer = nn::makeOptimizer({.lr = 0.1f, .momentum = 0.9f}, other->params.numel());
    job.place(*other, *optimizer);
    std::string m = invalidArgument([&] { job.load(ckpt); });
    if (m.find("model") == std::string::npos || m.find(kSpec) == std::string::npos) return 40;
    return 0;
  });
  runRanks(1, [&](const runtime::WorldInfo& world) {
    auto net = std::make_unique<nn::Sequential>();
    net->add(std::make_unique<nn::Linear>(20, 7), "fc0")
        .add(nn::relu(), "relu0")
        .add(std::make_unique<nn::Linear>(7, 3), "fc1");
    nn::Model impostor(std::move(net), {.name = kSpec});
    Job job({}, world);
    auto optimizer = nn::makeOptimizer({.lr = 0.1f, .momentum = 0.9f}, impostor.params.numel());
    job.place(impostor, *optimizer);
    std::string m = invalidArgument([&] { job.load(ckpt); });
    if (m.find("another model") == std::string::npos || m.find("fc0.weight") == std::string::npos) return 41;
    return 0;
  });
}

}  // namespace
}  // namespace cohort::train
