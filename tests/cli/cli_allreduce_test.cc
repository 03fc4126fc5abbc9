// `cohort train --mode allreduce` end to end: N workers × batch b equal one worker × batch N·b (same
// seed) to 1e-5 on every parameter after 20 steps, for shm and mpi; and one job under cohortrun,
// under mpirun and under SLURM's variables set by hand sees the same ranks and the same accuracy.
// Every test has its own temporary directory as COHORT_SHM_DIR.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

const std::vector<std::string> kMpirun = {"/usr/bin/mpirun", "--oversubscribe", "-x", "COHORT_SHM_DIR", "-np"};

std::vector<std::string> trainArgs(const std::vector<std::string>& extra) {
  std::vector<std::string> a = {cohortBinary(), "train", "--data", "synthetic", "--model", "mlp:784,64,10", "--lr", "0.05",
                                "--momentum", "0.9", "--seed", "5", "--threads", "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

class AllreduceCliTest : public ShmDirTest {
 protected:
  void SetUp() override {
    ShmDirTest::SetUp();
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
  CommandResult run(std::vector<std::string> launcher, const std::vector<std::string>& worker) {
    launcher.insert(launcher.end(), worker.begin(), worker.end());
    return runCommand(launcher, {.timeout = std::chrono::seconds(240)});
  }
  std::vector<std::string> cohortrun(int n) { return {runfile("launcher/cohortrun"), "--nproc-per-node", std::to_string(n), "--"}; }
  std::vector<std::string> mpirun(int n) {
    std::vector<std::string> v = kMpirun;
    v.push_back(std::to_string(n));
    return v;
  }

  // Trains 20 steps N workers x batch b with `launcher`, and 1 worker x batch N*b, and compares.
  // `extra`: more flags for the N-worker job (e.g. --replicas).
  // `accumulate`: K micro-batches of b per step for the N workers, against one worker's batch of N·K·b.
  // `clip` > 0: both jobs clip the gradient to that norm, and the one worker's step lines must show
  // that most steps needed it.
  void expectEquivalent(const std::vector<std::string>& launcher, int n, const std::string& backend,
                        const std::vector<std::string>& extra = {}, int accumulate = 1, double clip = 0) {
    const int b = 16;
    std::string many = dir_ + "/many.st", one = dir_ + "/one.st", metrics = dir_ + "/one.jsonl";
    std::vector<std::string> both;
    if (clip > 0) both = {"--clip-grad-norm", std::to_string(clip)};
    std::vector<std::string> args = {"--batch-size", std::to_string(b), "--max-steps", "20", "--checkpoint", many};
    if (!launcher.empty()) args.insert(args.end(), {"--mode", "allreduce", "--backend", backend});
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), both.begin(), both.end());
    if (accumulate > 1) args.insert(args.end(), {"--accumulate-steps", std::to_string(accumulate)});
    CommandResult r = launcher.empty() ? runCommand(trainArgs(args), {.timeout = std::chrono::seconds(240)})
                                       : run(launcher, trainArgs(args));
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    std::vector<std::string> single = {"train", "--data", "synthetic", "--model", "mlp:784,64,10", "--lr", "0.05", "--momentum",
                                       "0.9", "--seed", "5", "--threads", "1", "--batch-size", std::to_string(n * b * accumulate),
                                       "--max-steps", "20", "--checkpoint", one, "--metrics", metrics, "--log-every-steps", "1"};
    single.insert(single.end(), both.begin(), both.end());
    std::remove(metrics.c_str());
    CommandResult s = runCohort(single);
    ASSERT_EQ(s.exitCode, 0) << s.describe();
    if (clip > 0) {
      int clipped = 0;
      std::istringstream lines(readFile(metrics));
      for (std::string line; std::getline(lines, line);) clipped += jsonNumber(line, "grad_norm") > clip;
      EXPECT_GE(clipped, 15) << "of 20 steps clipped";
    }
    EXPECT_EQ(nn::readCheckpoint(many).metadata["step"], "20");
    EXPECT_EQ(expectSameParameters(one, many, 1e-5, "(" + backend + ", " + std::to_string(n) + " workers)"), 4);
    EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
  }
};

// Issue 16: K micro-batches per step equal one batch of K times the samples (20 steps, 1e-5), alone
// (mode local), and with 2 and 3 workers over shm (one shared copy and replicas) and mpi.
TEST_F(AllreduceCliTest, AccumulatedMicroBatchesEqualOneBatchAlone) {
  expectEquivalent({}, 1, "", {"--mode", "local"}, 4);
}
TEST_F(AllreduceCliTest, AccumulatedMicroBatchesEqualOneBatchWithTwoAndThreeWorkers) {
  expectEquivalent(cohortrun(2), 2, "shm", {}, 2);
  expectEquivalent(cohortrun(3), 3, "shm", {"--replicas"}, 3);
  expectEquivalent(mpirun(2), 2, "mpi", {}, 2);
}

// Issue 16: clipping applies to the averaged gradient, whose norm every rank knows (the shared
// copy adds up its slices'): 2 workers equal one worker with the combined batch after 20 clipped steps.
TEST_F(AllreduceCliTest, ClippedWorkersEqualOneClippedWorkerWithTheCombinedBatch) {
  expectEquivalent(cohortrun(2), 2, "shm", {}, 1, 0.1);
  expectEquivalent(cohortrun(2), 2, "shm", {"--replicas"}, 1, 0.1);
  expectEquivalent(mpirun(2), 2, "mpi", {}, 1, 0.1);
}

// ZeRO: the sharded stages train as one worker with the combined batch does, micro-batches and
// clipping included, over shm and over mpi (docs/sharding.md).
TEST_F(AllreduceCliTest, ZeroStagesEqualOneWorkerWithTheCombinedBatch) {
  expectEquivalent(cohortrun(3), 3, "shm", {"--zero", "2"}, 2, 0.1);
  expectEquivalent(mpirun(2), 2, "mpi", {"--zero", "1"}, 2, 0.1);
  expectEquivalent(mpirun(3), 3, "mpi", {"--zero", "2"});
}

TEST_F(AllreduceCliTest, TwoShmWorkersEqualOneWorkerWithTheCombinedBatch) { expectEquivalent(cohortrun(2), 2, "shm"); }
TEST_F(AllreduceCliTest, ThreeShmWorkersEqualOneWorkerWithTheCombinedBatch) { expectEquivalent(cohortrun(3), 3, "shm"); }
TEST_F(AllreduceCliTest, TwoMpiWorkersEqualOneWorkerWithTheCombinedBatch) { expectEquivalent(mpirun(2), 2, "mpi"); }
// --replicas: the shm communicator's bucketed gradient all-reduce instead of the shared copy updated in slices.
TEST_F(AllreduceCliTest, TwoShmReplicaWorkersEqualOneWorkerWithTheCombinedBatch) {
  expectEquivalent(cohortrun(2), 2, "shm", {"--replicas"});
}
TEST_F(AllreduceCliTest, ThreeShmReplicaWorkersEqualOneWorkerWithTheCombinedBatch) {
  expectEquivalent(cohortrun(3), 3, "shm", {"--replicas"});
}

// Shared-copy shm training keeps one optimizer state in shared memory, each rank updating its slice:
// the checkpoint must still hold all of it, so 10 steps + 10 resumed equal 20 in one go, bit for bit.
TEST_F(AllreduceCliTest, SharedCopyShmTrainingResumesBitForBit) {
  for (const std::string optimizer : {"sgd", "adam"}) {
    std::string whole = dir_ + "/whole-" + optimizer + ".st", split = dir_ + "/split-" + optimizer + ".st";
    auto job = [&](const std::string& path, const std::string& steps, bool resume) {
      std::vector<std::string> a = {"--mode", "allreduce", "--backend", "shm", "--optimizer", optimizer,
                                    "--batch-size", "16", "--max-steps", steps, "--checkpoint", path};
      if (resume) a.push_back("--resume");
      return run(cohortrun(3), trainArgs(a));
    };
    CommandResult r = job(whole, "20", false);
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    r = job(split, "10", false);
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    r = job(split, "20", true);
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    EXPECT_NE(r.stdoutText.find("resumed from " + split), std::string::npos) << r.stdoutText;
    EXPECT_EQ(nn::readCheckpoint(split).metadata["step"], "20");
    expectIdenticalCheckpoints(whole, split, optimizer);
  }
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

TEST_F(AllreduceCliTest, CohortrunMpirunAndSlurmVariablesSeeTheSameRanksAndAccuracy) {
  const std::vector<std::string> job = trainArgs({"--mode", "allreduce", "--backend", "shm", "--epochs", "1", "--batch-size", "64"});
  CommandResult viaCohortrun = run(cohortrun(2), job);
  ASSERT_EQ(viaCohortrun.exitCode, 0) << viaCohortrun.describe();
  CommandResult viaMpirun = run(mpirun(2), job);
  ASSERT_EQ(viaMpirun.exitCode, 0) << viaMpirun.describe();
  // SLURM: two processes started by hand with srun's variables.
  std::string quoted;
  for (const auto& a : job) quoted += " '" + a + "'";
  std::string slurm = "for r in 0 1; do SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_LOCALID=$r SLURM_TASKS_PER_NODE=2 "
                      "SLURM_JOB_ID=4242$$ " + quoted + " > '" + dir_ + "/slurm.'$r 2>&1 & done; wait; cat '" + dir_ +
                      "/slurm.0' '" + dir_ + "/slurm.1'";
  CommandResult viaSlurm = runCommand({"/bin/sh", "-c", slurm}, {.timeout = std::chrono::seconds(240)});
  ASSERT_EQ(viaSlurm.exitCode, 0) << viaSlurm.describe();
  for (const CommandResult* r : {&viaCohortrun, &viaMpirun, &viaSlurm}) {
    EXPECT_NE(r->stdoutText.find("rank 1 of 2 (local 1 of 2)"), std::string::npos) << r->describe();
    EXPECT_NE(r->stdoutText.find("rank 0 of 2 (local 0 of 2)"), std::string::npos) << r->describe();
  }
  EXPECT_NE(viaMpirun.stdoutText.find("from openmpi variables"), std::string::npos) << viaMpirun.stdoutText;
  EXPECT_NE(viaSlurm.stdoutText.find("from slurm variables"), std::string::npos) << viaSlurm.stdoutText;
  ResultLine a = parseResultLine(viaCohortrun.stdoutText), b = parseResultLine(viaMpirun.stdoutText),
             c = parseResultLine(viaSlurm.stdoutText);
  ASSERT_EQ(a.count, 1);
  EXPECT_EQ(a.fields["test_acc"], b.fields["test_acc"]);
  EXPECT_EQ(a.fields["test_acc"], c.fields["test_acc"]);
  EXPECT_EQ(a.fields["train_loss"], c.fields["train_loss"]);
  EXPECT_EQ(a.fields["mode"], "allreduce");
  EXPECT_EQ(a.fields["backend"], "shm");
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

// Issue 15: huge timeouts (inf too) mean "wait very long"; they used to overflow and fail at the
// first wait ("timed out after -9223372036854776.0 s").
TEST_F(AllreduceCliTest, HugeTimeoutsWaitInsteadOfOverflowing) {
  for (const char* timeout : {"inf", "1e10"}) {
    CommandResult r = run(cohortrun(2), trainArgs({"--mode", "allreduce", "--max-steps", "20", "--timeout", timeout}));
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    EXPECT_EQ(parseResultLine(r.stdoutText).count, 1) << r.describe();
  }
}

// Issue 16: the start-up line states the effective batch; --scale-lr linear is --lr x workers.
TEST_F(AllreduceCliTest, TheEffectiveBatchIsStatedAndScaleLrAppliesTheLinearRule) {
  const std::string scaled = dir_ + "/scaled.st", plain = dir_ + "/plain.st";
  CommandResult a = run(cohortrun(2), trainArgs({"--mode", "allreduce", "--max-steps", "20", "--scale-lr", "linear",
                                                 "--checkpoint", scaled}));
  ASSERT_EQ(a.exitCode, 0) << a.describe();
  EXPECT_NE(a.stdoutText.find("[rank 0] effective batch 128 (2 workers x 64): --lr 0.05 scaled linearly to 0.1"),
            std::string::npos)
      << a.stdoutText;
  std::vector<std::string> args = trainArgs({"--mode", "allreduce", "--max-steps", "20", "--checkpoint", plain});
  args[std::find(args.begin(), args.end(), "--lr") - args.begin() + 1] = "0.1";
  CommandResult b = run(cohortrun(2), args);
  ASSERT_EQ(b.exitCode, 0) << b.describe();
  EXPECT_NE(b.stdoutText.find("effective batch 128 (2 workers x 64): one worker's --lr"), std::string::npos) << b.stdoutText;
  EXPECT_TRUE(readFile(scaled) == readFile(plain)) << "--scale-lr linear with --lr 0.05 differs from --lr 0.1";
}

TEST_F(AllreduceCliTest, Sigusr1MakesEveryRankStopAtOneStepCheckpointAndExitCleanly) {
  // cohortrun forwards SIGUSR1 (as SLURM's --signal does through srun); the workers agree on a step,
  // rank 0 checkpoints and all exit 0; the same command with --resume then finishes the epochs.
  std::string ckpt = dir_ + "/usr1.st";
  std::vector<std::string> job = trainArgs({"--mode", "allreduce", "--backend", "shm", "--epochs", "3", "--batch-size", "64",
                                            "--checkpoint", ckpt, "--checkpoint-every", "50", "--resume"});
  std::string quoted;
  for (const auto& a : cohortrun(2)) quoted += " '" + a + "'";
  for (const auto& a : job) quoted += " '" + a + "'";
  // Signal once the first periodic checkpoint exists (training is under way), polling, bounded.
  std::string script = quoted + " & pid=$!; n=0; until [ -f '" + ckpt +
                       "' ] || [ $n -ge 1200 ]; do sleep 0.05; n=$((n+1)); done; kill -USR1 $pid; wait $pid";
  CommandResult r = runCommand({"/bin/sh", "-c", script}, {.timeout = std::chrono::seconds(240)});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.stdoutText.find("stop requested (SIGUSR1)"), std::string::npos) << r.stdoutText;
  EXPECT_NE(r.stdoutText.find("continue with the same command and --resume"), std::string::npos) << r.stdoutText;
  ResultLine stopped = parseResultLine(r.stdoutText);
  ASSERT_EQ(stopped.count, 1) << r.stdoutText;
  EXPECT_EQ(stopped.fields["stopped"], "signal") << r.stdoutText;
  EXPECT_LT(stopped.number("epochs"), 3) << "epochs= counts completed epochs only";
  CommandResult resumed = run(cohortrun(2), job);
  ASSERT_EQ(resumed.exitCode, 0) << resumed.describe();
  EXPECT_NE(resumed.stdoutText.find("resumed from " + ckpt), std::string::npos) << resumed.stdoutText;
  EXPECT_EQ(parseResultLine(resumed.stdoutText).number("epochs"), 3);
  EXPECT_FALSE(parseResultLine(resumed.stdoutText).has("stopped")) << resumed.stdoutText;
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

}  // namespace
}  // namespace cohort::testing
