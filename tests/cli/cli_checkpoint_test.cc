// Checkpoint and resume through the command line: a run stopped with --max-steps and resumed with
// --resume ends with a checkpoint byte-identical to the uninterrupted run's, and reports the same
// losses and accuracy; no temporary file is left behind (docs/checkpoints.md, train/trainer.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

// A small model keeps each run around a second: 938 steps per epoch (60000 / 64).
std::vector<std::string> run(const std::string& checkpoint, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {
      "train",   "--model",    "mlp:784,64,10", "--epochs", "2", "--batch-size", "64", "--lr",
      "0.05",    "--momentum", "0.9",           "--seed",   "3", "--threads",    "1",  "--checkpoint",
      checkpoint};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

ResultLine expectSuccess(const std::vector<std::string>& args) {
  CommandResult r = runCohort(args);
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.stderrText, "") << r.describe();
  ResultLine result = parseResultLine(r.stdoutText);
  EXPECT_EQ(result.count, 1) << r.describe();
  return result;
}

void expectSameOutcome(const ResultLine& a, const ResultLine& b) {
  for (const char* key : {"epochs", "train_loss", "test_loss", "test_acc"}) {
    EXPECT_TRUE(a.has(key)) << key;
    EXPECT_EQ(a.fields.at(key), b.fields.count(key) ? b.fields.at(key) : "(absent)") << key;
  }
}

void expectNoTemporaryFiles(const std::string& dir) {
  for (const std::string& name : listDir(dir)) EXPECT_NE(name.front(), '.') << "left behind: " << dir << "/" << name;
}

class CliCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = freshTempDir();
    uninterrupted_ = expectSuccess(run(path("a.st"), {}));
    ASSERT_TRUE(fileExists(path("a.st")));
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
  ResultLine uninterrupted_;
};

TEST_F(CliCheckpointTest, StoppedInSecondEpochResumesBitExactly) {
  ResultLine stopped = expectSuccess(run(path("b.st"), {"--max-steps", "1200"}));
  ASSERT_TRUE(fileExists(path("b.st")));
  // A stopped run says so, and counts only the epochs it completed.
  EXPECT_EQ(stopped.fields["stopped"], "max_steps");
  EXPECT_EQ(stopped.fields["epochs"], "1");
  EXPECT_NE(readFile(path("a.st")), readFile(path("b.st"))) << "the stopped run's checkpoint is mid-epoch 2";
  EXPECT_NE(stopped.fields["train_loss"], uninterrupted_.fields["train_loss"]);

  ResultLine resumed = expectSuccess(run(path("b.st"), {"--resume"}));
  EXPECT_TRUE(readFile(path("a.st")) == readFile(path("b.st"))) << "a.st and b.st differ";
  expectSameOutcome(uninterrupted_, resumed);
  expectNoTemporaryFiles(dir_);
}

TEST_F(CliCheckpointTest, PeriodicCheckpointsStoppedInFirstEpochResumeBitExactly) {
  ResultLine stopped = expectSuccess(run(path("c.st"), {"--checkpoint-every", "100", "--max-steps", "250"}));
  EXPECT_EQ(stopped.fields["epochs"], "0") << "no epoch was completed";
  EXPECT_EQ(stopped.fields["stopped"], "max_steps");
  ResultLine resumed = expectSuccess(run(path("c.st"), {"--checkpoint-every", "100", "--resume"}));
  EXPECT_FALSE(resumed.has("stopped")) << "a finished run has no stopped= field";
  EXPECT_TRUE(readFile(path("a.st")) == readFile(path("c.st"))) << "a.st and c.st differ";
  expectSameOutcome(uninterrupted_, resumed);
  expectNoTemporaryFiles(dir_);
}

// Issue 16: a run stopped mid-schedule (cosine after warmup, 3 micro-batches per step: 313 steps an
// epoch, the last of 2) and resumed ends bit for bit where the uninterrupted one does: the learning
// rate is a function of the optimizer's step, steps start at group boundaries, and clipping
// depends on nothing but the step's gradient.
TEST_F(CliCheckpointTest, AScheduleWithAccumulationAndClippingResumesBitExactly) {
  const std::vector<std::string> schedule = {"--lr-schedule", "cosine", "--warmup-steps", "100", "--min-lr", "0.001",
                                             "--accumulate-steps", "3", "--clip-grad-norm", "0.3"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), schedule.begin(), schedule.end());
    return extra;
  };
  ResultLine whole = expectSuccess(run(path("s1.st"), with({"--metrics", path("s1.jsonl")})));
  EXPECT_NE(whole.fields["train_loss"], uninterrupted_.fields["train_loss"]) << "the schedule changed nothing";
  // Clipping was on: the largest gradient norm of each epoch exceeded the limit.
  const std::string metrics = readFile(path("s1.jsonl"));
  EXPECT_EQ(countLines(metrics), 2) << metrics;
  for (size_t at = 0, end; (end = metrics.find('\n', at)) != std::string::npos; at = end + 1) {
    EXPECT_GT(jsonNumber(metrics.substr(at, end - at), "grad_norm_max"), 0.3) << metrics;
  }
  expectSuccess(run(path("s2.st"), with({"--max-steps", "400"})));
  ResultLine resumed = expectSuccess(run(path("s2.st"), with({"--resume"})));
  EXPECT_TRUE(readFile(path("s1.st")) == readFile(path("s2.st"))) << "s1.st and s2.st differ";
  expectSameOutcome(whole, resumed);
}

// Resuming a finished run trains nothing more and keeps the checkpoint as it was.
TEST_F(CliCheckpointTest, ResumingAFinishedRunChangesNothing) {
  const std::string before = readFile(path("a.st"));
  CommandResult r = runCohort(run(path("a.st"), {"--resume"}));
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_TRUE(readFile(path("a.st")) == before);
  expectNoTemporaryFiles(dir_);
}

// --resume without an existing checkpoint starts from scratch and ends like the plain run.
TEST_F(CliCheckpointTest, ResumeWithoutCheckpointStartsFromScratch) {
  ResultLine fresh = expectSuccess(run(path("d.st"), {"--resume"}));
  EXPECT_TRUE(readFile(path("a.st")) == readFile(path("d.st")));
  expectSameOutcome(uninterrupted_, fresh);
}

}  // namespace
}  // namespace cohort::testing
