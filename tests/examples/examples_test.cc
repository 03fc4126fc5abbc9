// The examples as users run them (issue 14): built programs started under cohortrun, mpirun or
// alone, checked by their exit code, their RESULT line and their checkpoints.
//   custom_layer  a user layer in a residual network reaches its stated accuracy under cohortrun in
//                 hogwild and allreduce (2 workers);
//   own_loop      K micro-batches of b per step equal `cohort train` with batches of K·b to 1e-5 after
//                 20 steps: alone, with 2 workers under cohortrun (shm) and under mpirun (mpi); and a
//                 run resumed from its checkpoint ends where the uninterrupted one does;
//   regression    Boston housing reaches its stated test RMSE.
// Every test has its own directory, used as COHORT_SHM_DIR.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

std::vector<std::string> cohortrun(int n) { return {runfile("launcher/cohortrun"), "--nproc-per-node", std::to_string(n), "--"}; }
std::vector<std::string> mpirun(int n) {
  return {"/usr/bin/mpirun", "--oversubscribe", "-x", "COHORT_SHM_DIR", "-np", std::to_string(n)};
}
std::vector<std::string> join(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class ExamplesTest : public ShmDirTest {
 protected:
  void SetUp() override {
    ShmDirTest::SetUp();
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
  CommandResult run(const std::vector<std::string>& argv) {
    return runCommand(argv, {.timeout = std::chrono::seconds(240)});
  }
};

TEST_F(ExamplesTest, CustomLayerReachesItsAccuracyInHogwildAndAllreduce) {
  for (const char* mode : {"hogwild", "allreduce"}) {
    CommandResult r = run(join(cohortrun(2), {runfile("examples/custom_layer/custom_layer"), "--mode", mode}));
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    ResultLine result = parseResultLine(r.stdoutText);
    EXPECT_EQ(result.fields["mode"], mode);
    EXPECT_EQ(result.fields["world_size"], "2");
    EXPECT_GE(result.number("test_acc"), 0.9) << r.describe();
    EXPECT_NE(r.stdoutText.find("train_error"), std::string::npos) << "the callback's own figure is logged\n" << r.stdoutText;
    EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
  }
}

// The largest difference between two checkpoints' parameters (those of `reference`).
double worstDifference(const std::string& reference, const std::string& other) {
  nn::Checkpoint a = nn::readCheckpoint(reference), b = nn::readCheckpoint(other);
  double worst = 0;
  int compared = 0;
  for (const auto& t : a.tensors) {
    if (t.name.rfind("optimizer.", 0) == 0) continue;
    const runtime::Tensor* u = b.find(t.name);
    if (!u || u->numel() != t.tensor.numel()) return INFINITY;
    for (int64_t i = 0; i < t.tensor.numel(); ++i) worst = std::max(worst, std::fabs(double(t.tensor.at(i)) - u->at(i)));
    ++compared;
  }
  return compared == 4 ? worst : INFINITY;  // mlp:784,64,10: two weights, two biases
}

TEST_F(ExamplesTest, OwnLoopWithMicroBatchesEqualsCohortTrainAloneUnderCohortrunAndUnderMpirun) {
  const std::vector<std::string> common = {"--model", "mlp:784,64,10", "--lr", "0.05", "--momentum", "0.9", "--seed", "5"};
  const std::string reference = dir_ + "/train.st";
  CommandResult t = runCohort(join({"train", "--data", "synthetic", "--batch-size", "64", "--max-steps", "20",
                                    "--threads", "1", "--checkpoint", reference},
                                   common));
  ASSERT_EQ(t.exitCode, 0) << t.describe();
  const std::string ownLoop = runfile("examples/own_loop/own_loop");
  struct Case {
    std::string name;
    std::vector<std::string> launcher;
    std::vector<std::string> flags;
  };
  const std::vector<Case> cases = {
      {"alone", {}, {"--batch", "16", "--micro-batches", "4"}},
      {"cohortrun-shm", cohortrun(2), {"--mode", "allreduce", "--batch", "8", "--micro-batches", "4"}},
      {"cohortrun-shm-2x16", cohortrun(2), {"--mode", "allreduce", "--batch", "16", "--micro-batches", "2"}},
      {"mpirun-mpi", mpirun(2), {"--mode", "allreduce", "--backend", "mpi", "--batch", "8", "--micro-batches", "4"}},
  };
  for (const Case& c : cases) {
    const std::string path = dir_ + "/" + c.name + ".st";
    CommandResult r = run(join(join(c.launcher, {ownLoop, "--steps", "20", "--checkpoint", path}), join(c.flags, common)));
    ASSERT_EQ(r.exitCode, 0) << c.name << "\n" << r.describe();
    ResultLine result = parseResultLine(r.stdoutText);
    EXPECT_EQ(result.fields["steps"], "20") << c.name;
    EXPECT_LE(worstDifference(reference, path), 1e-5) << c.name;
  }
  EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
}

TEST_F(ExamplesTest, OwnLoopResumesFromItsCheckpoint) {
  const std::string ownLoop = runfile("examples/own_loop/own_loop");
  const std::vector<std::string> flags = {"--mode", "allreduce", "--batch", "8", "--micro-batches", "2", "--seed", "3"};
  const std::string whole = dir_ + "/whole.st", split = dir_ + "/split.st";
  CommandResult a = run(join(join(cohortrun(2), {ownLoop, "--steps", "16", "--checkpoint", whole}), flags));
  ASSERT_EQ(a.exitCode, 0) << a.describe();
  CommandResult b = run(join(join(cohortrun(2), {ownLoop, "--steps", "7", "--checkpoint", split}), flags));
  ASSERT_EQ(b.exitCode, 0) << b.describe();
  CommandResult c = run(join(join(cohortrun(2), {ownLoop, "--steps", "16", "--checkpoint", split, "--resume"}), flags));
  ASSERT_EQ(c.exitCode, 0) << c.describe();
  EXPECT_EQ(worstDifference(whole, split), 0.0) << "a resumed run continues bit for bit";
  // A checkpoint of other micro-batches is refused, naming the value.
  CommandResult d = run(join(join(cohortrun(2), {ownLoop, "--steps", "20", "--checkpoint", split, "--resume", "--mode",
                                                 "allreduce", "--batch", "4", "--micro-batches", "2", "--seed", "3"}),
                             {}));
  EXPECT_EQ(d.exitCode, 2) << d.describe();
  EXPECT_NE((d.stdoutText + d.stderrText).find("micro_batch"), std::string::npos) << d.describe();
}

TEST_F(ExamplesTest, RegressionReachesItsTestRmse) {
  const char* home = std::getenv("HOME");
  const std::string csv = std::string(home ? home : "/root") + "/.cache/cohort/data/boston_house_prices.csv";
  ASSERT_TRUE(fileExists(csv)) << csv << " is missing: scripts/fetch-data puts it there (scripts/test runs it)";
  CommandResult r = run({runfile("examples/regression/regression"), "--csv", csv});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  ResultLine result = parseResultLine(r.stdoutText);
  EXPECT_LT(result.number("test_rmse"), 4.0) << r.describe();
}

}  // namespace
}  // namespace cohort::testing
