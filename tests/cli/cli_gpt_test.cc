// `cohort train --model gpt:... --data text:FILE` end to end (issue 20), and the same corpus as
// token shards (`--data tokens:PATTERN`, issue 32): a small GPT learns a text
// and reports its loss per token with the perplexity and tokens/s; two workers step as one with their
// combined batch; allreduce (one shared copy, and
// replicas) and Hogwild runs stopped with --max-steps and resumed end bit for bit where the
// uninterrupted run does, as the other models' runs do (cli_checkpoint_test, cli_allreduce_test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/random.h"
#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

// About 40 KB of sentences made of a small vocabulary: enough structure for a tiny model to learn
// quickly, with a test split (the last 10%) of the same kind.
std::string sentences() {
  const char* subjects[] = {"the cat", "a dog", "my friend", "the old man", "our teacher", "a small bird"};
  const char* verbs[] = {"sees", "likes", "follows", "finds", "helps", "remembers"};
  const char* objects[] = {"the river", "a red ball", "the garden", "an open door", "the morning", "a quiet song"};
  runtime::Rng rng(7);
  std::string text;
  while (text.size() < 40000) {
    text += subjects[rng.below(6)];
    text += ' ';
    text += verbs[rng.below(6)];
    text += ' ';
    text += objects[rng.below(6)];
    text += ".\n";
  }
  return text;
}

class GptCliTest : public ShmDirTest {
 protected:
  void SetUp() override {
    ShmDirTest::SetUp();
    corpus_ = dir_ + "/corpus.txt";
    writeFile(corpus_, sentences());
    data_ = {"--data", "text:" + corpus_};
  }
  std::vector<std::string> train(const std::vector<std::string>& extra) const {
    std::vector<std::string> a = {cohortBinary(), "train", "--model", "gpt:layers=1,heads=2,dim=32,ctx=16",
                                  "--seed", "4", "--threads", "1", "--progress-every", "0"};
    a.insert(a.end(), data_.begin(), data_.end());
    a.insert(a.end(), extra.begin(), extra.end());
    // The recipe's flags, unless `extra` gives them: AdamW, lr 0.01, batch 16.
    for (const auto& [flag, value] : {std::pair<std::string, std::string>{"--optimizer", "adamw"},
                                      {"--lr", "0.01"},
                                      {"--batch-size", "16"}}) {
      if (std::find(extra.begin(), extra.end(), flag) != extra.end()) continue;
      a.push_back(flag);
      a.push_back(value);
    }
    return a;
  }
  CommandResult cohortrun(int n, const std::vector<std::string>& worker) const {
    std::vector<std::string> argv = {runfile("launcher/cohortrun"), "--nproc-per-node", std::to_string(n), "--"};
    argv.insert(argv.end(), worker.begin(), worker.end());
    return runCommand(argv, {.timeout = std::chrono::seconds(180)});
  }
  // Runs to `stop` = `whole`, and to `half` then resumed to `whole`, and compares the checkpoints.
  void expectResumesBitForBit(int workers, const std::vector<std::string>& flags, const std::string& stop = "--max-steps",
                              const std::string& half = "8", const std::string& full = "16") {
    const std::string whole = dir_ + "/whole.st", split = dir_ + "/split.st";
    auto job = [&](const std::string& path, const std::string& steps, bool resume) {
      std::vector<std::string> a = flags;
      for (const std::string& s : {stop, steps, std::string("--checkpoint"), path}) a.push_back(s);
      if (resume) a.push_back("--resume");
      return cohortrun(workers, train(a));
    };
    CommandResult r = job(whole, full, false);
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    ASSERT_EQ((r = job(split, half, false)).exitCode, 0) << r.describe();
    ASSERT_EQ((r = job(split, full, true)).exitCode, 0) << r.describe();
    EXPECT_NE(r.stdoutText.find("resumed from " + split), std::string::npos) << r.stdoutText;
    expectIdenticalCheckpoints(whole, split);
    EXPECT_TRUE(listDir(shm_).empty()) << "shared memory left behind";
  }
  // Two workers × batch 8 step as one worker × batch 16 (the same windows, the gradient averaged):
  // after 20 steps every parameter within 1e-5, one shared copy and replicas alike. SGD with
  // momentum: Adam turns the rounding of a gradient that is exactly zero (c_attn's key bias) into
  // steps of lr.
  void expectTwoWorkersEqualOne() {
    const std::vector<std::string> steps = {"--max-steps", "20", "--epochs", "1", "--optimizer", "sgd", "--lr", "0.05",
                                            "--momentum", "0.9"};
    auto with = [&](std::vector<std::string> a, const std::string& batch, const std::string& checkpoint) {
      a.insert(a.end(), steps.begin(), steps.end());
      for (const std::string& s :
           {std::string("--batch-size"), batch, std::string("--checkpoint"), dir_ + "/" + checkpoint}) {
        a.push_back(s);
      }
      return train(a);
    };
    CommandResult r = runCommand(with({}, "16", "one.st"), {.timeout = std::chrono::seconds(120)});
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    ASSERT_EQ((r = cohortrun(2, with({"--mode", "allreduce"}, "8", "shared.st"))).exitCode, 0) << r.describe();
    ASSERT_EQ((r = cohortrun(2, with({"--mode", "allreduce", "--replicas"}, "8", "replicas.st"))).exitCode, 0)
        << r.describe();
    EXPECT_GT(expectSameParameters(dir_ + "/one.st", dir_ + "/shared.st", 1e-5, "one shared copy"), 10);
    EXPECT_GT(expectSameParameters(dir_ + "/one.st", dir_ + "/replicas.st", 1e-5, "replicas"), 10);
  }
  // Trains 150 steps and checks what the model learned on the test set.
  void expectLearns() {
    CommandResult r = runCommand(train({"--epochs", "1", "--max-steps", "150"}), {.timeout = std::chrono::seconds(120)});
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    ResultLine result = parseResultLine(r.stdoutText);
    ASSERT_EQ(result.count, 1) << r.stdoutText;
    // From ln 256 = 5.55 nats per byte (a uniform guess) to well under the 2.9 nats of the text's
    // byte frequencies alone.
    const double testLoss = result.number("test_loss");
    EXPECT_LT(testLoss, 2.0) << r.stdoutText;
    EXPECT_NEAR(result.number("test_ppl"), std::exp(testLoss), 1e-3 * std::exp(testLoss)) << r.stdoutText;
    EXPECT_GT(result.number("test_acc"), 0.3) << "the share of bytes predicted right: " << r.stdoutText;
    EXPECT_NEAR(result.number("tokens_per_s"), 16 * result.number("samples_per_s"), 16) << r.stdoutText;
  }
  std::string corpus_;
  std::vector<std::string> data_;  // --data (and --test-data) flags
};

// The same corpus as token shards (issue 32): its bytes as uint16 ids, the first 90% in two train
// shards and the rest in a validation shard, all in llm.c's layout (one glob has one layout; raw
// shards: token_shards_test).
class GptTokensCliTest : public GptCliTest {
 protected:
  void SetUp() override {
    GptCliTest::SetUp();
    const std::string text = sentences();
    const size_t train = text.size() - text.size() / 10, half = train / 2;
    writeFile(dir_ + "/train_000.bin", shard(text.substr(0, half), true));
    writeFile(dir_ + "/train_001.bin", shard(text.substr(half, train - half), true));
    writeFile(dir_ + "/val_000.bin", shard(text.substr(train), true));
    data_ = {"--data", "tokens:" + dir_ + "/train_*.bin", "--test-data", "tokens:" + dir_ + "/val_*.bin"};
  }
  static std::string shard(const std::string& bytes, bool llmc) {
    std::string out;
    if (llmc) {
      int32_t header[256] = {20240520, 1, static_cast<int32_t>(bytes.size())};
      out.assign(reinterpret_cast<const char*>(header), sizeof(header));
    }
    for (unsigned char c : bytes) {
      const uint16_t id = c;
      out.append(reinterpret_cast<const char*>(&id), sizeof(id));
    }
    return out;
  }
};

TEST_F(GptCliTest, ASmallGptLearnsTheTextAndReportsLossPerTokenWithPerplexity) { expectLearns(); }

TEST_F(GptTokensCliTest, ASmallGptLearnsFromTokenShards) { expectLearns(); }

// `cohort eval` reads the same validation shards and reports the run's own test figures.
TEST_F(GptTokensCliTest, EvalOfTheCheckpointGivesTheRunsTestFigures) {
  const std::string checkpoint = dir_ + "/run.st";
  CommandResult r = runCommand(train({"--epochs", "1", "--max-steps", "20", "--checkpoint", checkpoint}),
                               {.timeout = std::chrono::seconds(120)});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  ResultLine trained = parseResultLine(r.stdoutText);
  CommandResult e = runCommand({cohortBinary(), "eval", "--checkpoint", checkpoint, "--data", data_[3]});
  ASSERT_EQ(e.exitCode, 0) << e.describe();
  ResultLine eval = parseResultLine(e.stdoutText);
  ASSERT_FALSE(trained.fields["test_loss"].empty()) << r.stdoutText;
  EXPECT_EQ(eval.fields["test_loss"], trained.fields["test_loss"]) << e.stdoutText << r.stdoutText;
  EXPECT_EQ(eval.fields["test_acc"], trained.fields["test_acc"]) << e.stdoutText;
}

TEST_F(GptCliTest, ANonLanguageModelOnTextIsRefused) {
  CommandResult r = runCommand({cohortBinary(), "train", "--data", "text:" + corpus_, "--model", "mlp:16,10"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find("--model gpt:"), std::string::npos) << r.describe();
}

TEST_F(GptCliTest, TwoWorkersEqualOneWorkerWithTheCombinedBatch) { expectTwoWorkersEqualOne(); }

TEST_F(GptTokensCliTest, TwoWorkersEqualOneWorkerWithTheCombinedBatch) { expectTwoWorkersEqualOne(); }

TEST_F(GptTokensCliTest, AllreduceResumesBitForBit) {
  expectResumesBitForBit(2, {"--mode", "allreduce", "--backend", "shm", "--epochs", "1"});
}

TEST_F(GptCliTest, AllreduceWithOneSharedCopyResumesBitForBit) {
  expectResumesBitForBit(2, {"--mode", "allreduce", "--backend", "shm", "--epochs", "1"});
}

TEST_F(GptCliTest, AllreduceWithReplicasResumesBitForBit) {
  expectResumesBitForBit(2, {"--mode", "allreduce", "--backend", "shm", "--replicas", "--epochs", "1"});
}

// --recompute (issue 46, item 2) changes no bit of training: a 3-block GPT (its blocks share buffers
// with recompute) trained 6 steps of 2 accumulated micro-batches, alone and on 2 ranks (one shared
// copy, and replicas), ends with the checkpoint of the run without recompute in every mode. (Hogwild
// races by design: its runs do not repeat bit for bit, with or without recompute.)
TEST_F(GptCliTest, RecomputeTrainsTheSameBitsAloneAndOnTwoRanks) {
  int runs = 0;
  for (const auto& [workers, mode] : std::vector<std::pair<int, std::vector<std::string>>>{
           {1, {"--mode", "local"}}, {2, {"--mode", "allreduce"}}, {2, {"--mode", "allreduce", "--replicas"}}}) {
    std::string reference;
    for (const std::string& recompute : {std::string("none"), std::string("selective"), std::string("full")}) {
      SCOPED_TRACE(std::to_string(workers) + " workers, --recompute " + recompute);
      const std::string checkpoint = dir_ + "/" + std::to_string(++runs) + "-" + recompute + ".st";
      std::vector<std::string> a = mode;
      for (const std::string& s :
           {std::string("--max-steps"), std::string("6"), std::string("--accumulate-steps"), std::string("2"),
            std::string("--recompute"), recompute, std::string("--checkpoint"), checkpoint}) {
        a.push_back(s);
      }
      std::vector<std::string> argv = train(a);
      *std::find(argv.begin(), argv.end(), "gpt:layers=1,heads=2,dim=32,ctx=16") = "gpt:layers=3,heads=2,dim=32,ctx=16";
      const CommandResult r = cohortrun(workers, argv);
      ASSERT_EQ(r.exitCode, 0) << r.describe();
      if (!reference.empty()) expectIdenticalCheckpoints(reference, checkpoint);
      if (reference.empty()) reference = checkpoint;
    }
  }
}

TEST_F(GptCliTest, RecomputeIsForAGpt) {
  const CommandResult r = runCommand({cohortBinary(), "train", "--model", "mlp:784,10", "--recompute", "full",
                                      "--max-steps", "1", "--progress-every", "0"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find("--recompute full is for a GPT"), std::string::npos) << r.stderrText;
}

// One Hogwild worker is deterministic (several race by design): its resume is bit-exact too.
// Hogwild checkpoints at the ends of epochs: 1 epoch, then resumed to 2.
TEST_F(GptCliTest, HogwildResumesBitForBit) { expectResumesBitForBit(1, {"--mode", "hogwild"}, "--epochs", "1", "2"); }

}  // namespace
}  // namespace cohort::testing
