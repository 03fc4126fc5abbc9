// The commands read a sharded checkpoint as one model (issue 46, item 3): 2 workers under cohortrun
// train with --zero 1 and --async-checkpoints (each worker's shard file written in the background,
// the manifest committed at a later step), and `cohort eval` of that checkpoint prints exactly the
// test figures of the run's RESULT line, and exactly those of a whole-model checkpoint of the same
// state (the sharded one assembled and written as one file). The run logs each commit with its
// staging figures.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/model_spec.h"
#include "nn/sharded_checkpoint.h"
#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

class ZeroCheckpointCliTest : public ShmDirTest {
 protected:
  // A 3-class CSV whose class is the largest of three features.
  std::string csv() { return writeLargestOfThreeCsv(dir_ + "/cls.csv"); }
};

TEST_F(ZeroCheckpointCliTest, EvalReadsAShardedCheckpointAsTheWholeModel) {
  const std::string data = csv(), sharded = dir_ + "/sharded.st", whole = dir_ + "/whole.st";
  CommandResult r = runCommand({runfile("launcher/cohortrun"), "--nproc-per-node", "2", "--", cohortBinary(), "train",
                                "--mode", "allreduce", "--zero", "1", "--async-checkpoints", "--checkpoint", sharded,
                                "--checkpoint-every", "2", "--data", data, "--test-data", data, "--model", "mlp:3,16,3",
                                "--optimizer", "adamw", "--lr", "0.01", "--epochs", "2", "--batch-size", "16", "--seed", "4",
                                "--threads", "1"},
                               {.timeout = std::chrono::seconds(240)});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const ResultLine trained = parseResultLine(r.stdoutText);
  EXPECT_FALSE(linesWith(r.stdoutText, "committed to " + sharded).empty()) << r.stdoutText;
  EXPECT_FALSE(linesWith(r.stdoutText, "MiB per rank").empty()) << r.stdoutText;
  ASSERT_TRUE(nn::isShardedManifest(nn::readCheckpoint(sharded)));
  EXPECT_TRUE(fileExists(nn::shardFilePath(sharded, *nn::committedShardGeneration(sharded), 1, 2)));
  // The same state as one whole-model file.
  const nn::Checkpoint assembled = nn::readAnyCheckpoint(sharded, {.split = nn::buildModel("mlp:3,16,3")->params.entries()});
  nn::writeCheckpoint(whole, assembled.tensors, assembled.metadata);
  ASSERT_FALSE(nn::isShardedManifest(nn::readCheckpoint(whole)));
  for (const std::string& file : {sharded, whole}) {
    CommandResult e = runCohort({"eval", "--data", data, "--checkpoint", file});
    ASSERT_EQ(e.exitCode, 0) << e.describe();
    const ResultLine figures = parseResultLine(e.stdoutText);
    EXPECT_EQ(figures.fields.at("test_loss"), trained.fields.at("test_loss")) << file << "\n" << e.stdoutText;
    EXPECT_EQ(figures.fields.at("test_acc"), trained.fields.at("test_acc")) << file << "\n" << e.stdoutText;
  }
}

}  // namespace
}  // namespace cohort::testing
