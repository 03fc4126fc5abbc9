// What a --resume checks of the checkpoint's run (issue 44, items 8 to 10):
//   - the training data: a checkpoint records its name, size and digest (what the ranks' settings
//     agreement compares), and a resume on other data (another shard, the same tokens read as a raw
//     file, a CSV changed) is refused at once (exit 2) naming both, unless --resume-on-new-data says
//     so: then the weights, optimizer state and step count are kept and the epoch starts afresh. A
//     checkpoint that records no data (an older Cohort's) resumes with a warning. (It used to continue
//     the epoch on whatever data it was given, without a word.)
//   - the settings a resume may change (learning rate, weight decay, betas, schedule, clipping):
//     taken, each change logged.
//   - --max-steps N from a checkpoint already at step N or past it: nothing trained, the checkpoint
//     left byte for byte, said so, exit 0, in every mode that has --max-steps (it used to train one
//     more step each time and rewrite the checkpoint).
#include <gtest/gtest.h>
#include <stdio.h>

#include <cstdint>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// `rows` rows of 3 features and a class 0..3; `shift` changes every target.
std::string csvRows(int rows, int shift) {
  std::string text = "a,b,c,label\n";
  for (int i = 0; i < rows; ++i) {
    text += std::to_string(i % 7) + "," + std::to_string(i % 5) + "," + std::to_string(i % 3) + "," +
            std::to_string((i + shift) % 4) + "\n";
  }
  return text;
}

// Tokens below 32 from `seed`, as an llm.c shard (its header, then the tokens) or a raw one (the tokens
// alone, as nanoGPT writes them).
std::string tokenShard(size_t count, uint32_t seed, bool llmc) {
  std::vector<uint16_t> tokens(count);
  uint32_t x = seed * 2654435761u + 1;
  for (uint16_t& t : tokens) {
    x = x * 1664525u + 1013904223u;
    t = static_cast<uint16_t>((x >> 16) % 32);
  }
  std::string bytes;
  if (llmc) {
    const int32_t header[256] = {20240520, 1, static_cast<int32_t>(count)};
    bytes.assign(reinterpret_cast<const char*>(header), sizeof header);
  }
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
  return bytes;
}

class ResumeCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = freshTempDir(); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // A small classifier on the CSV `csv`, checkpointed at `ckpt`.
  static std::vector<std::string> csvRun(const std::string& csv, const std::string& ckpt,
                                         const std::vector<std::string>& extra = {}) {
    std::vector<std::string> a = {"train", "--data", "csv:" + csv, "--model", "mlp:3,8,4", "--epochs", "2",
                                  "--batch-size", "8", "--threads", "1", "--progress-every", "0", "--checkpoint", ckpt};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // A small GPT on the token files `spec` ("PATTERN" or "raw:PATTERN"), checkpointed at `ckpt`.
  static std::vector<std::string> tokensRun(const std::string& spec, const std::string& ckpt,
                                            const std::vector<std::string>& extra = {}) {
    std::vector<std::string> a = {"train", "--model", "gpt:layers=1,heads=1,dim=8,ctx=8,vocab=32", "--data",
                                  "tokens:" + spec, "--batch-size", "4", "--threads", "1", "--progress-every", "0",
                                  "--checkpoint", ckpt};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // Runs `args`, which must succeed; returns what it printed.
  static CommandResult succeed(const std::vector<std::string>& args) {
    CommandResult r = runCohort(args);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    return r;
  }
  // A resume on other data: exit 2 at once, naming the checkpoint's data (`was` in its name) and the
  // given data (`now`), the checkpoint untouched.
  static void expectRefused(const std::vector<std::string>& args, const std::string& ckpt, const std::string& was,
                            const std::string& now) {
    const std::string before = readFile(ckpt);
    CommandResult r = runCohort(args);
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    const size_t said = r.stderrText.find(ckpt + ": the checkpoint was trained on "),
                 given = r.stderrText.find(", and this run's data is ");
    ASSERT_NE(said, std::string::npos) << r.describe();
    ASSERT_NE(given, std::string::npos) << r.describe();
    EXPECT_TRUE(contains(r.stderrText.substr(said, given - said), was)) << r.describe();
    EXPECT_TRUE(contains(r.stderrText.substr(given), now)) << r.describe();
    EXPECT_TRUE(contains(r.stderrText, "--resume-on-new-data")) << r.describe();
    EXPECT_FALSE(contains(r.stdoutText, "RESULT")) << r.describe();
    EXPECT_TRUE(readFile(ckpt) == before) << "the checkpoint changed";
  }

  std::string dir_;
};

TEST_F(ResumeCliTest, AChangedCsvIsRefusedNamingBoth) {
  const std::string csv = path("rows.csv"), ckpt = path("c.st");
  writeFile(csv, csvRows(64, 0));
  succeed(csvRun(csv, ckpt, {"--max-steps", "3"}));
  writeFile(csv, csvRows(64, 1));  // the same name and size, other labels
  expectRefused(csvRun(csv, ckpt, {"--resume"}), ckpt, "csv:" + csv, "csv:" + csv);
}

TEST_F(ResumeCliTest, AnotherShardIsRefusedNamingBoth) {
  writeFile(path("a.bin"), tokenShard(800, 1, true));
  writeFile(path("b.bin"), tokenShard(800, 2, true));
  const std::string ckpt = path("t.st");
  succeed(tokensRun(path("a.bin"), ckpt, {"--max-steps", "3"}));
  expectRefused(tokensRun(path("b.bin"), ckpt, {"--resume"}), ckpt, "tokens:" + path("a.bin") + "/train",
                "tokens:" + path("b.bin") + "/train");
}

TEST_F(ResumeCliTest, TheSameTokensReadAsARawShardAreRefused) {
  writeFile(path("llmc.bin"), tokenShard(800, 1, true));
  writeFile(path("raw.bin"), tokenShard(800, 1, false));
  const std::string ckpt = path("t.st");
  succeed(tokensRun(path("llmc.bin"), ckpt, {"--max-steps", "3"}));
  expectRefused(tokensRun("raw:" + path("raw.bin"), ckpt, {"--resume"}), ckpt, path("llmc.bin"), path("raw.bin"));
}

TEST_F(ResumeCliTest, ResumeOnNewDataKeepsTheStateAndStartsTheEpochAfresh) {
  const std::string csv = path("rows.csv"), other = path("other.csv"), ckpt = path("c.st");
  writeFile(csv, csvRows(64, 0));
  writeFile(other, csvRows(48, 2));
  succeed(csvRun(csv, ckpt, {"--max-steps", "3"}));
  CommandResult r = succeed(csvRun(other, ckpt, {"--resume", "--resume-on-new-data"}));
  EXPECT_TRUE(contains(r.stdoutText, "resuming on new data (--resume-on-new-data): the checkpoint was trained on csv:" +
                                         csv + " (64 samples, digest "))
      << r.describe();
  EXPECT_TRUE(contains(r.stdoutText, "its epoch starts afresh on csv:" + other + " (48 samples, digest "))
      << r.describe();
  EXPECT_TRUE(contains(r.stdoutText, "resumed from " + ckpt + " at epoch 1 batch 0 (step 3)")) << r.describe();
  // Epoch 1 afresh on 48 samples (6 steps) and epoch 2 (6 steps) after the 3 kept.
  std::vector<std::string> more = csvRun(other, ckpt, {"--resume", "--max-steps", "15"});
  more[6] = "3";  // --epochs
  CommandResult again = succeed(more);
  EXPECT_TRUE(contains(again.stdoutText, "the checkpoint is at step 15, --max-steps 15: nothing to train"))
      << again.describe();
  // Without --resume the flag means nothing: refused.
  CommandResult alone = runCohort(csvRun(other, ckpt, {"--resume-on-new-data"}));
  EXPECT_EQ(alone.exitCode, 2) << alone.describe();
  EXPECT_TRUE(contains(alone.stderrText, "--resume-on-new-data needs --resume")) << alone.describe();
}

TEST_F(ResumeCliTest, TheSameDataMovedElsewhereResumes) {
  const std::string csv = path("rows.csv"), moved = path("moved.csv"), ckpt = path("c.st");
  writeFile(csv, csvRows(64, 0));
  succeed(csvRun(csv, ckpt, {"--max-steps", "3"}));
  ASSERT_EQ(::rename(csv.c_str(), moved.c_str()), 0);
  CommandResult r = succeed(csvRun(moved, ckpt, {"--resume"}));
  EXPECT_TRUE(contains(r.stdoutText, "the checkpoint's run read the same samples as csv:" + csv))
      << r.describe();
  EXPECT_TRUE(contains(r.stdoutText, "at epoch 1 batch 3 (step 3)")) << r.describe();
}

// A checkpoint of a Cohort from before the data was recorded: the keys removed.
TEST_F(ResumeCliTest, ACheckpointThatRecordsNoDataResumesWithAWarning) {
  const std::string csv = path("rows.csv"), ckpt = path("c.st");
  writeFile(csv, csvRows(64, 0));
  succeed(csvRun(csv, ckpt, {"--max-steps", "3"}));
  nn::Checkpoint old = nn::readCheckpoint(ckpt);
  for (const char* key : {"train_data", "train_samples", "train_data_digest"}) ASSERT_EQ(old.metadata.erase(key), 1u) << key;
  nn::writeCheckpoint(ckpt, old.tensors, old.metadata);
  ASSERT_EQ(nn::readCheckpoint(ckpt).metadata.count("train_data_digest"), 0u);
  CommandResult r = succeed(csvRun(csv, ckpt, {"--resume"}));
  EXPECT_TRUE(contains(r.stdoutText, "warning: " + ckpt + " does not record the data it was trained on (written by an older "
                                            "Cohort): cannot check that csv:" + csv + " is that data"))
      << r.describe();
  EXPECT_TRUE(contains(r.stdoutText, "at epoch 1 batch 3 (step 3)")) << r.describe();
}

// Item 9: each change is logged, and taken.
TEST_F(ResumeCliTest, ChangedHyperParametersAreLoggedOnResume) {
  const std::string csv = path("rows.csv"), ckpt = path("c.st");
  writeFile(csv, csvRows(64, 0));
  succeed(csvRun(csv, ckpt,
                 {"--optimizer", "adamw", "--lr", "0.003", "--weight-decay", "0.1", "--betas", "0.9,0.95",
                  "--clip-grad-norm", "1", "--max-steps", "3"}));
  CommandResult same = succeed(csvRun(csv, ckpt,
                                      {"--optimizer", "adamw", "--lr", "0.003", "--weight-decay", "0.1", "--betas",
                                       "0.9,0.95", "--clip-grad-norm", "1", "--max-steps", "4", "--resume"}));
  EXPECT_FALSE(contains(same.stdoutText, "resuming with")) << same.describe();
  CommandResult r = succeed(csvRun(csv, ckpt,
                                   {"--optimizer", "adamw", "--lr", "0.001", "--weight-decay", "0.05", "--betas",
                                    "0.8,0.9", "--clip-grad-norm", "0.5", "--lr-schedule", "cosine", "--resume"}));
  for (const std::string line :
       {"resuming with lr 0.001 (the checkpoint's run had 0.003)", "resuming with weight decay 0.05 (the checkpoint's run had 0.1)",
        "resuming with betas 0.8,0.9 (the checkpoint's run had 0.9,0.95)",
        "resuming with clip grad norm 0.5 (the checkpoint's run had 1)",
        "resuming with lr schedule cosine from 0.001 to 0 by step 16 (the checkpoint's run had none)"}) {
    EXPECT_TRUE(contains(r.stdoutText, line)) << line << "\n" << r.describe();
  }
}

// Item 10: --max-steps N from a checkpoint at step N (or past it) trains nothing and leaves it as it
// is, alone and as an allreduce job of 2 workers (shared parameters, and --replicas).
TEST_F(ResumeCliTest, MaxStepsAlreadyReachedTrainsNothingAndLeavesTheCheckpoint) {
  const std::string csv = path("rows.csv");
  writeFile(csv, csvRows(64, 0));
  const std::vector<std::vector<std::string>> modes = {{}, {"--mode", "allreduce"}, {"--mode", "allreduce", "--replicas"}};
  for (size_t m = 0; m < modes.size(); ++m) {
    const std::string ckpt = path("m" + std::to_string(m) + ".st");
    std::vector<std::string> prefix;
    if (!modes[m].empty()) prefix = {runfile("launcher/cohortrun"), "--nproc-per-node", "2", "--"};
    auto run = [&](const std::string& maxSteps, bool resume) {
      std::vector<std::string> argv = prefix;
      argv.push_back(cohortBinary());
      for (const std::string& a : csvRun(csv, ckpt, modes[m])) argv.push_back(a);
      argv.insert(argv.end(), {"--max-steps", maxSteps});
      if (resume) argv.push_back("--resume");
      return runCommand(argv, {.timeout = std::chrono::seconds(120)});
    };
    CommandResult first = run("2", false);
    ASSERT_EQ(first.exitCode, 0) << first.describe();
    const std::string written = readFile(ckpt);
    for (const std::string maxSteps : {"2", "1"}) {
      CommandResult r = run(maxSteps, true);
      EXPECT_EQ(r.exitCode, 0) << r.describe();
      EXPECT_TRUE(contains(r.stdoutText, "the checkpoint is at step 2, --max-steps " + maxSteps + ": nothing to train"))
          << r.describe();
      EXPECT_EQ(parseResultLine(r.stdoutText).fields["stopped"], "max_steps") << r.describe();
      EXPECT_TRUE(readFile(ckpt) == written) << "mode " << m << ", --max-steps " << maxSteps << ": the checkpoint changed";
    }
  }
}

}  // namespace
}  // namespace cohort::testing
