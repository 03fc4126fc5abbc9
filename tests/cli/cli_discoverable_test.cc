// What a new language-model user finds without reading the source (issue 47, item 8): --help of
// train, eval and predict names every --data form; the directories of --checkpoint, --metrics,
// --tensorboard and export's output are made as nanoGPT makes its out_dir; `cohort predict` on a
// GPT writes the distribution of the token after each window (its last position's), all of it or
// the --top-k most likely with their text.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/random.h"
#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

constexpr int kContext = 16;

// About 20 KB of short sentences: a tiny GPT learns their bytes within a few dozen steps.
std::string sentences() {
  const char* subjects[] = {"the cat", "a dog", "my friend"};
  const char* verbs[] = {"sees", "likes"};
  const char* objects[] = {"the river", "a red ball"};
  runtime::Rng rng(3);
  std::string text;
  while (text.size() < 20000) {
    text += std::string(subjects[rng.below(3)]) + " " + verbs[rng.below(2)] + " " + objects[rng.below(2)] + ".\n";
  }
  return text;
}

// llm.c's tokenizer layout for `size` tokens: token i < 256 is byte i, the others made-up "<i>".
std::string byteTokenizer(uint32_t size = 256) {
  uint32_t header[256] = {20240328, 1, size};
  std::string out(reinterpret_cast<const char*>(header), sizeof(header));
  for (uint32_t i = 0; i < size; ++i) {
    const std::string piece = i < 256 ? std::string(1, static_cast<char>(i)) : "<" + std::to_string(i) + ">";
    out += static_cast<char>(piece.size()) + piece;
  }
  return out;
}

// The records of a CSV text, each split into its fields: quoted fields may hold commas, newlines
// and doubled quotes (RFC 4180).
std::vector<std::vector<std::string>> readCsv(const std::string& text) {
  std::vector<std::vector<std::string>> records(1);
  std::string field;
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted && c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
      field += '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if ((c == ',' || c == '\n') && !quoted) {
      records.back().push_back(field);
      field.clear();
      if (c == '\n' && i + 1 < text.size()) records.emplace_back();
    } else {
      field += c;
    }
  }
  return records;
}

class DiscoverableCliTest : public ShmDirTest {
 protected:
  void SetUp() override {
    ShmDirTest::SetUp();
    text_ = sentences();
    writeFile(dir_ + "/corpus.txt", text_);
  }
  // A GPT trained 40 steps on the corpus, its outputs under directories that do not exist yet.
  CommandResult trainGpt() const {
    return runCohort({"train", "--model", "gpt:layers=1,heads=2,dim=32,ctx=16", "--data", "text:" + dir_ + "/corpus.txt",
                      "--optimizer", "adamw", "--lr", "0.01", "--batch-size", "16", "--max-steps", "40", "--seed", "5",
                      "--progress-every", "0", "--checkpoint", dir_ + "/out/ckpt/run.st", "--metrics",
                      dir_ + "/out/logs/metrics.jsonl", "--tensorboard", dir_ + "/out/tb/run1"});
  }
  std::string text_;
};

TEST_F(DiscoverableCliTest, HelpOfTrainEvalAndPredictNamesEveryDataForm) {
  for (const char* command : {"train", "eval", "predict"}) {
    const CommandResult r = runCohort({command, "--help"});
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    for (const char* form : {"synthetic", "mnist:DIR", "cifar10:DIR", "csv:FILE", "text:FILE", "tokens:PATTERN",
                             "tokens:raw:PATTERN"}) {
      EXPECT_NE(r.stdoutText.find(form), std::string::npos) << command << " --help lacks " << form << ":\n" << r.stdoutText;
    }
  }
}

TEST_F(DiscoverableCliTest, TheOutputsDirectoriesAreMadeAndAFileInTheWayIsNamed) {
  const CommandResult r = trainGpt();
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_TRUE(fileExists(dir_ + "/out/ckpt/run.st"));
  EXPECT_TRUE(fileExists(dir_ + "/out/logs/metrics.jsonl"));
  EXPECT_FALSE(listDir(dir_ + "/out/tb/run1").empty());
  // export's output: a HuggingFace directory and an llm.c file, each below directories made for it.
  for (auto [format, out] : {std::pair<std::string, std::string>{"hf", "/exports/hf/gpt"}, {"llmc", "/exports/llmc/gpt.bin"}}) {
    const CommandResult e = runCohort({"export", dir_ + "/out/ckpt/run.st", dir_ + out, "--format", format});
    ASSERT_EQ(e.exitCode, 0) << e.describe();
  }
  EXPECT_TRUE(fileExists(dir_ + "/exports/hf/gpt/model.safetensors"));
  EXPECT_TRUE(fileExists(dir_ + "/exports/llmc/gpt.bin"));
  // A file where a directory should be made: one line naming it, exit 2, nothing written.
  writeFile(dir_ + "/blocker", "x");
  const CommandResult refused = runCohort({"train", "--model", "mlp:784,10", "--max-steps", "1", "--checkpoint",
                                           dir_ + "/blocker/run/run.st"});
  EXPECT_EQ(refused.exitCode, 2) << refused.describe();
  EXPECT_NE(refused.stderrText.find("cannot create directory " + dir_ + "/blocker: a file is there"), std::string::npos)
      << refused.describe();
}

// predict's row of a window is the distribution of the next token: its most likely token is the one
// greedy generation appends to the window's text, and --top-k K lists the full distribution's K
// largest, best first, with the tokens' text.
TEST_F(DiscoverableCliTest, PredictOnAGptGivesTheNextTokenAfterEachWindow) {
  ASSERT_EQ(trainGpt().exitCode, 0);
  const std::string ckpt = dir_ + "/out/ckpt/run.st", data = "text:" + dir_ + "/corpus.txt";
  writeFile(dir_ + "/bytes.bin", byteTokenizer());
  const CommandResult all = runCohort({"predict", "--checkpoint", ckpt, "--data", data, "--output", dir_ + "/all.csv"});
  ASSERT_EQ(all.exitCode, 0) << all.describe();
  const CommandResult top = runCohort({"predict", "--checkpoint", ckpt, "--data", data, "--output", dir_ + "/top.csv",
                                       "--top-k", "3", "--tokenizer", dir_ + "/bytes.bin"});
  ASSERT_EQ(top.exitCode, 0) << top.describe();
  const auto allRows = readCsv(readFile(dir_ + "/all.csv")), topRows = readCsv(readFile(dir_ + "/top.csv"));
  ASSERT_EQ(allRows.size(), topRows.size());
  EXPECT_EQ(topRows[0], (std::vector<std::string>{"id1", "p1", "text1", "id2", "p2", "text2", "id3", "p3", "text3"}));
  const int64_t testBegin = static_cast<int64_t>(text_.size()) - static_cast<int64_t>(text_.size()) / 10;
  for (size_t w = 0; w < 4; ++w) {
    const std::vector<std::string>& p = allRows[w + 1];
    const std::vector<std::string>& t = topRows[w + 1];
    ASSERT_EQ(p.size(), 257u);
    ASSERT_EQ(t.size(), 9u);
    for (int r = 0; r < 3; ++r) {
      const int id = std::stoi(t[3 * r]);
      EXPECT_EQ(t[3 * r + 1], p[id]) << "window " << w << ", rank " << r + 1;
      EXPECT_EQ(t[3 * r + 2], std::string(1, static_cast<char>(id)));
      if (r > 0) EXPECT_GE(std::stod(t[3 * r - 2]), std::stod(t[3 * r + 1]));
    }
    EXPECT_EQ(std::stoi(p[256]), std::stoi(t[0])) << "the predicted token is the most likely";
    // Greedy generation from the window's text appends that token (the test windows follow each
    // other from the last 10% of the text, kContext bytes apart).
    const std::string window = text_.substr(testBegin + w * kContext, kContext);
    const CommandResult g = runCohort({"generate", "--checkpoint", ckpt, "--prompt", window, "--tokens", "1", "--top-k", "1"});
    ASSERT_EQ(g.exitCode, 0) << g.describe();
    ASSERT_GT(g.stdoutText.size(), window.size()) << g.describe();
    EXPECT_EQ(static_cast<unsigned char>(g.stdoutText[window.size()]), std::stoi(t[0])) << "window '" << window << "'";
  }
  const CommandResult bad = runCohort({"predict", "--checkpoint", ckpt, "--data", data, "--output", dir_ + "/x.csv",
                                       "--tokenizer", dir_ + "/bytes.bin"});
  EXPECT_EQ(bad.exitCode, 2) << bad.describe();
  EXPECT_NE(bad.stderrText.find("--tokenizer is for --top-k K"), std::string::npos) << bad.describe();
}

// nanoGPT's max_iters: --max-steps without --epochs trains as many epochs as it takes, and a cosine
// schedule decays over those steps (its last step at --min-lr), where the default of one epoch
// used to end the run at 15 steps without a word.
TEST_F(DiscoverableCliTest, MaxStepsWithoutEpochsTrainsThatManyStepsAndTheScheduleFollows) {
  const std::string data = writeLargestOfThreeCsv(dir_ + "/three.csv");  // 240 rows: 15 steps of 16 per epoch
  const CommandResult r = runCohort({"train", "--model", "mlp:3,8,3", "--data", data, "--batch-size", "16", "--lr", "0.1",
                                     "--lr-schedule", "cosine", "--min-lr", "0.001", "--max-steps", "40",
                                     "--log-every-steps", "20", "--progress-every", "0"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.stdoutText.find("epoch 3/3 step 40 "), std::string::npos) << r.stdoutText;
  EXPECT_NE(r.stdoutText.find("step 40/40 | loss "), std::string::npos) << r.stdoutText;
  // Step 40 applies the rate of t = 39 of 40: 0.001 + 0.099 (1 + cos(39 pi / 40)) / 2 = 0.00115259 (over
  // the 3 epochs' 45 steps it would be 0.00529).
  EXPECT_NE(r.stdoutText.find(" | lr 0.00115259 | "), std::string::npos) << "cosine over --max-steps\n" << r.stdoutText;
  // --epochs given: the run ends there, as before.
  const CommandResult two = runCohort({"train", "--model", "mlp:3,8,3", "--data", data, "--batch-size", "16",
                                       "--epochs", "2", "--max-steps", "40", "--progress-every", "0"});
  ASSERT_EQ(two.exitCode, 0) << two.describe();
  EXPECT_NE(two.stdoutText.find("epoch 2/2 step 30 "), std::string::npos) << two.stdoutText;
}

// A gpt: spec without vocab= takes --tokenizer's size (--pad-vocab: rounded up to a multiple of 128,
// the padding left out of the loss); without a tokenizer, token shards are refused naming the vocab.
TEST_F(DiscoverableCliTest, TheVocabularyComesFromTheTokenizer) {
  // A tokenizer of 300 tokens and shards of its ids.
  writeFile(dir_ + "/t300.bin", byteTokenizer(300));
  std::vector<uint16_t> ids(2000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>(i % 3 ? (i * 7) % 256 : 256 + i % 44);
  writeFile(dir_ + "/train.bin", std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 2));
  const std::vector<std::string> base = {"train", "--model", "gpt:layers=1,heads=2,dim=16,ctx=8", "--data",
                                         "tokens:raw:" + dir_ + "/train.bin", "--max-steps", "2", "--progress-every", "0"};
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), extra.begin(), extra.end());
    return runCohort(argv);
  };
  const CommandResult sized = run({"--tokenizer", dir_ + "/t300.bin"});
  ASSERT_EQ(sized.exitCode, 0) << sized.describe();
  EXPECT_NE(sized.stdoutText.find("cohort train: gpt:layers=1,heads=2,dim=16,ctx=8,vocab=300 "), std::string::npos)
      << sized.stdoutText;
  const CommandResult padded = run({"--tokenizer", dir_ + "/t300.bin", "--pad-vocab"});
  ASSERT_EQ(padded.exitCode, 0) << padded.describe();
  EXPECT_NE(padded.stdoutText.find("cohort train: gpt:layers=1,heads=2,dim=16,ctx=8,vocab=300,padded_vocab=384 "),
            std::string::npos)
      << padded.stdoutText;
  const CommandResult none = run({});
  EXPECT_EQ(none.exitCode, 2) << none.describe();
  EXPECT_EQ(countLines(none.stderrText), 1) << none.describe();
  EXPECT_NE(none.stderrText.find("is not below the model's vocabulary of 256: --model gpt:layers=1,heads=2,dim=16,ctx=8 "
                                 "has no vocab=, so its vocabulary is bytes"),
            std::string::npos)
      << none.describe();
  EXPECT_NE(none.stderrText.find("add vocab=50257 for GPT-2's"), std::string::npos) << none.describe();
  const CommandResult alone = run({"--pad-vocab"});
  EXPECT_EQ(alone.exitCode, 2) << alone.describe();
  EXPECT_NE(alone.stderrText.find("--pad-vocab pads --tokenizer's vocabulary: give --tokenizer"), std::string::npos)
      << alone.describe();
}

// A resume notes what changed that the checkpoint records: the weight-decay groups (logged, as the
// other optimizer settings), and another tokenizer (a warning: its ids stand for other text).
TEST_F(DiscoverableCliTest, AResumeSaysWhenTheGroupsOrTheTokenizerChanged) {
  writeFile(dir_ + "/bytes.bin", byteTokenizer());
  writeFile(dir_ + "/t300.bin", byteTokenizer(300));
  auto run = [&](const std::string& tokenizer, const std::string& groups, const std::string& steps) {
    return runCohort({"train", "--model", "gpt:layers=1,heads=2,dim=16,ctx=8,vocab=300", "--data",
                      "text:" + dir_ + "/corpus.txt", "--optimizer", "adamw", "--max-steps", steps, "--progress-every",
                      "0", "--checkpoint", dir_ + "/r.st", "--resume", "--tokenizer", tokenizer,
                      "--weight-decay-groups", groups});
  };
  ASSERT_EQ(run(dir_ + "/bytes.bin", "matrices", "3").exitCode, 0);
  const CommandResult same = run(dir_ + "/bytes.bin", "matrices", "5");
  ASSERT_EQ(same.exitCode, 0) << same.describe();
  EXPECT_EQ(same.stdoutText.find("resuming with weight decay groups"), std::string::npos) << same.stdoutText;
  EXPECT_EQ(same.stderrText.find("another tokenizer"), std::string::npos) << same.describe();
  const CommandResult changed = run(dir_ + "/t300.bin", "all", "7");
  ASSERT_EQ(changed.exitCode, 0) << changed.describe();
  EXPECT_NE(changed.stdoutText.find("resuming with weight decay groups none (the checkpoint's run had "),
            std::string::npos)
      << changed.stdoutText;
  EXPECT_NE((changed.stdoutText + changed.stderrText).find("resuming with another tokenizer (digest "), std::string::npos)
      << changed.describe();
}

}  // namespace
}  // namespace cohort::testing
