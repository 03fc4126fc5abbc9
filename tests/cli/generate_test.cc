// `cohort generate` (issue 20) on a tiny gpt checkpoint trained once for the suite: the same seed
// gives the same bytes, other seeds other text, stdout is the prompt then exactly N bytes and a
// newline, greedy decoding (--top-k 1) ignores the seed, a run past the context writes what fits with
// a note, and every bad input exits 2 with one stderr line naming the problem. A second checkpoint,
// trained on token shards with a 300-token vocabulary, takes its prompt as ids and prints ids or, with
// an llm.c tokenizer file written here, their text (issue 32). Issue 47: a prompt past the context is
// cropped to its last tokens with a note, ids mark where the prompt ends, and a checkpoint trained with
// --tokenizer records its digest, against which generate's --tokenizer is checked (a warning).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/tokenizer.h"
#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

constexpr int kContext = 64;
const char kSpec[] = "gpt:layers=1,heads=2,dim=16,ctx=64";

class GenerateCliTest : public ::testing::Test {
 protected:
  // One gpt and one mlp checkpoint for every test (training takes well under a second each).
  static void SetUpTestSuite() {
    dir_ = new std::string(freshTempDir());
    // Words drawn by a fixed LCG: about 6 KB of text whose last 10% holds many windows of ctx + 1.
    const std::vector<std::string> words = {"the",  "quick", "brown", "fox", "jumps",
                                            "over", "lazy",  "dog",   "cat", "sat"};
    std::string text;
    uint32_t state = 12345;
    while (text.size() < 6000) {
      state = state * 1664525u + 1013904223u;
      text += words[(state >> 16) % words.size()] + (state % 7 == 0 ? ".\n" : " ");
    }
    writeFile(path("text.txt"), text);
    CommandResult gpt = runCohort({"train", "--threads", "1", "--data", "text:" + path("text.txt"), "--model", kSpec,
                                   "--optimizer", "adamw", "--lr", "0.003", "--batch-size", "8", "--max-steps", "20",
                                   "--epochs", "1", "--checkpoint", path("gpt.ckpt")});
    EXPECT_EQ(gpt.exitCode, 0) << gpt.describe();
    // The same text as token ids of a 300-token vocabulary (issue 32): a shard of its bytes.
    std::string shard;
    for (unsigned char c : text) shard.append({static_cast<char>(c), '\0'});
    writeFile(path("text.bin"), shard);
    writeFile(path("tokenizer300.bin"), tokenizer(300, 1));
    writeFile(path("other300.bin"), tokenizer(300, 1, "["));  // the same size, other tokens: another digest
    writeFile(path("tokenizer100.bin"), tokenizer(100, 2));
    // Trained with --tokenizer: the checkpoint records its digest.
    CommandResult ids = runCohort({"train", "--threads", "1", "--data", "tokens:raw:" + path("text.bin"), "--model",
                                   std::string(kSpec) + ",vocab=300", "--max-steps", "5", "--epochs", "1",
                                   "--tokenizer", path("tokenizer300.bin"), "--checkpoint", path("gpt300.ckpt")});
    EXPECT_EQ(ids.exitCode, 0) << ids.describe();
    CommandResult mlp = runCohort({"train", "--threads", "1", "--data", "synthetic", "--model", "mlp:784,16,10",
                                   "--max-steps", "2", "--checkpoint", path("mlp.ckpt")});
    EXPECT_EQ(mlp.exitCode, 0) << mlp.describe();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(fileExists(path("gpt.ckpt"))) << "the suite's training run failed"; }

  static std::string path(const std::string& name) { return *dir_ + "/" + name; }

  // llm.c's tokenizer layout for `size` tokens: token i < 256 is byte i, the others "<i>" (or with
  // `open` "[": "[i>").
  static std::string tokenizer(uint32_t size, uint32_t version, const std::string& open = "<") {
    uint32_t header[256] = {20240328, version, size};
    std::string out(reinterpret_cast<const char*>(header), sizeof(header));
    for (uint32_t i = 0; i < size; ++i) {
      const std::string piece = i < 256 ? std::string(1, static_cast<char>(i)) : open + std::to_string(i) + ">";
      out += static_cast<char>(piece.size());
      out += piece;
    }
    return out;
  }

  // `cohort generate` on the suite's gpt checkpoint with `args` after it.
  static CommandResult generate(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"generate", "--checkpoint", path("gpt.ckpt")};
    argv.insert(argv.end(), args.begin(), args.end());
    return runCohort(argv);
  }
  // Its stdout, which must come with exit 0 and nothing on stderr.
  static std::string text(const std::vector<std::string>& args) {
    CommandResult r = generate(args);
    EXPECT_EQ(r.exitCode, 0) << r.describe();
    EXPECT_EQ(r.stderrText, "") << r.describe();
    return r.stdoutText;
  }

  static std::string* dir_;
};

std::string* GenerateCliTest::dir_ = nullptr;

TEST_F(GenerateCliTest, TheSameSeedGivesTheSameBytes) {
  const std::vector<std::string> args = {"--prompt", "the cat", "--tokens", "40", "--seed", "5"};
  const std::string first = text(args);
  EXPECT_EQ(text(args), first);
  EXPECT_EQ(text({"--prompt", "the cat", "--tokens", "40", "--seed", "5", "--temperature", "1", "--top-k", "0"}), first)
      << "the defaults are temperature 1 and top-k 0";
}

TEST_F(GenerateCliTest, OtherSeedsGiveOtherText) {
  std::set<std::string> texts;
  for (const char* seed : {"1", "2", "3"})
    texts.insert(text({"--prompt", "the cat", "--tokens", "40", "--seed", seed}));
  // 40 bytes from a barely trained model: three seeds agreeing on all of them would be a broken seed.
  EXPECT_GE(texts.size(), 2u) << *texts.begin();
}

TEST_F(GenerateCliTest, StdoutIsThePromptThenTheTokensAndANewline) {
  const std::string prompt = "na\xc3\xafve dog";  // "naïve dog": 10 bytes, 10 tokens
  for (const char* tokens : {"1", "40"}) {
    const std::string out = text({"--prompt", prompt, "--tokens", tokens, "--temperature", "0.7", "--top-k", "5"});
    ASSERT_EQ(out.size(), prompt.size() + std::stoul(tokens) + 1) << out;
    EXPECT_EQ(out.substr(0, prompt.size()), prompt);
    EXPECT_EQ(out.back(), '\n');
  }
}

TEST_F(GenerateCliTest, GreedyDecodingIsDeterministicAndIgnoresTheSeed) {
  const std::string greedy = text({"--prompt", "the ", "--tokens", "30", "--top-k", "1"});
  EXPECT_EQ(text({"--prompt", "the ", "--tokens", "30", "--top-k", "1"}), greedy);
  EXPECT_EQ(text({"--prompt", "the ", "--tokens", "30", "--top-k", "1", "--seed", "99", "--temperature", "3"}), greedy)
      << "top-k 1 is the argmax: neither the seed nor the temperature may change it";
}

// Past the context the window slides: all the tokens asked for, and nothing on stderr.
TEST_F(GenerateCliTest, PastTheContextTheWindowSlides) {
  CommandResult r = generate({"--prompt", "the cat", "--tokens", "150"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.stdoutText.size(), 7u + 150u + 1u) << r.describe();
  EXPECT_EQ(r.stderrText, "") << r.describe();
  // A prompt that fills the context continues too.
  const std::string full(kContext, 'a');
  CommandResult filled = generate({"--prompt", full, "--tokens", "3"});
  ASSERT_EQ(filled.exitCode, 0) << filled.describe();
  EXPECT_EQ(filled.stdoutText.size(), full.size() + 3u + 1u) << filled.describe();
  EXPECT_EQ(filled.stdoutText.compare(0, full.size(), full), 0) << filled.describe();
}

// Issue 33: the text is written as it is made, and a reader that goes away ends the generation. Ten
// million tokens (about half an hour of sampling) into `head -c 20`: the pipeline ends at once, with
// the prompt and the first tokens read. Before, nothing was printed until the end and a closed pipe
// went unnoticed, so the shell waited for the whole run.
TEST_F(GenerateCliTest, TheTextStreamsAndAClosedPipeEndsTheGeneration) {
  const std::string command = cohortBinary() + " generate --checkpoint '" + path("gpt.ckpt") +
                              "' --prompt 'the cat' --tokens 10000000 | head -c 20; echo \" status ${PIPESTATUS[0]}\"";
  const auto start = std::chrono::steady_clock::now();
  CommandResult r = runCommand({"/bin/bash", "-c", command}, {.timeout = std::chrono::seconds(60)});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.stdoutText.substr(0, 7), "the cat") << r.describe();
  EXPECT_NE(r.stdoutText.find(" status 0"), std::string::npos) << "generate ends quietly on EPIPE\n" << r.describe();
  EXPECT_LT(seconds, 30.0) << r.describe();
  EXPECT_EQ(r.stderrText, "") << r.describe();
}

// A vocabulary past bytes: the prompt as ids, the output as ids, or as text through a tokenizer;
// the same seed gives the same tokens either way.
TEST_F(GenerateCliTest, AVocabularyPastBytesTakesIdsAndPrintsIdsOrATokenizersText) {
  const std::vector<std::string> base = {"generate", "--checkpoint", path("gpt300.ckpt"), "--prompt-tokens",
                                         "116,104,101", "--tokens", "6", "--seed", "3"};
  CommandResult r = runCohort(base);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  // The ids mark where the prompt ends: "116,104,101|new,ids".
  ASSERT_EQ(r.stdoutText.rfind("116,104,101|", 0), 0u) << r.stdoutText;
  EXPECT_EQ(std::count(r.stdoutText.begin(), r.stdoutText.end(), '|'), 1) << r.stdoutText;
  std::vector<int64_t> ids;
  for (size_t at = 0; at < r.stdoutText.size();) {
    size_t end = r.stdoutText.find_first_of(",|\n", at);
    ids.push_back(std::stoll(r.stdoutText.substr(at, end - at)));
    at = end + 1;
  }
  ASSERT_EQ(ids.size(), 9u) << r.stdoutText;
  std::string want;
  for (int64_t id : ids) {
    ASSERT_TRUE(id >= 0 && id < 300) << r.stdoutText;
    want += id < 256 ? std::string(1, static_cast<char>(id)) : "<" + std::to_string(id) + ">";
  }
  std::vector<std::string> withTokenizer = base;
  withTokenizer.insert(withTokenizer.end(), {"--tokenizer", path("tokenizer300.bin")});
  CommandResult t = runCohort(withTokenizer);
  ASSERT_EQ(t.exitCode, 0) << t.describe();
  EXPECT_EQ(t.stdoutText, want + "\n");
  EXPECT_EQ(t.stderrText, "") << "the tokenizer the checkpoint was trained with: no warning\n" << t.describe();
  // --prompt as text, encoded by the tokenizer (here its bytes: no merge makes "th"), read from a
  // folder holding gpt2_tokenizer.bin: the same tokens.
  std::filesystem::create_directories(path("tokenizer_dir"));
  std::filesystem::copy_file(path("tokenizer300.bin"), path("tokenizer_dir/gpt2_tokenizer.bin"));
  CommandResult text = runCohort({"generate", "--checkpoint", path("gpt300.ckpt"), "--prompt", "the", "--tokens", "6",
                                  "--seed", "3", "--tokenizer", path("tokenizer_dir")});
  ASSERT_EQ(text.exitCode, 0) << text.describe();
  EXPECT_EQ(text.stdoutText, want + "\n");
}

// Issue 47: a prompt past the context continues from its last context tokens, as nanoGPT crops it;
// stdout still starts with the whole prompt, and stderr has one note. Greedy decoding shows the crop:
// the continuation is the one of the prompt's last 64 bytes.
TEST_F(GenerateCliTest, APromptPastTheContextIsCroppedToItsLastTokensWithANote) {
  std::string prompt;
  for (int i = 0; prompt.size() < kContext + 6; ++i) prompt += i % 3 ? "the dog " : "a cat ";
  prompt.resize(kContext + 6);
  CommandResult r = generate({"--prompt", prompt, "--tokens", "12", "--top-k", "1"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(countLines(r.stderrText), 1) << r.describe();
  EXPECT_NE(r.stderrText.find("the prompt is 70 tokens, more than the context of model " + std::string(kSpec) +
                              " (64 tokens): it is continued from its last 64 tokens"),
            std::string::npos)
      << r.describe();
  ASSERT_EQ(r.stdoutText.size(), prompt.size() + 12 + 1) << r.describe();
  EXPECT_EQ(r.stdoutText.substr(0, prompt.size()), prompt);
  const std::string tail = prompt.substr(prompt.size() - kContext);
  const std::string cropped = text({"--prompt", tail, "--tokens", "12", "--top-k", "1"});
  EXPECT_EQ(r.stdoutText.substr(prompt.size()), cropped.substr(tail.size()));
  // As ids too.
  std::string ids = "1";
  for (int i = 1; i < kContext + 2; ++i) ids += ",1";
  CommandResult asIds = runCohort({"generate", "--checkpoint", path("gpt300.ckpt"), "--prompt-tokens", ids, "--tokens",
                                   "2"});
  ASSERT_EQ(asIds.exitCode, 0) << asIds.describe();
  EXPECT_NE(asIds.stderrText.find("the prompt is 66 tokens"), std::string::npos) << asIds.describe();
  EXPECT_EQ(asIds.stdoutText.rfind(ids + "|", 0), 0u) << asIds.describe();
}

// Issue 47: `cohort train --tokenizer` records the tokenizer's digest, and generate with another
// tokenizer warns with one line naming both; with the same one, nothing (above); a checkpoint that
// records none (trained without --tokenizer) is never warned about.
TEST_F(GenerateCliTest, AnotherTokenizerThanTheCheckpointsIsWarnedAbout) {
  const std::string trained = nn::Tokenizer::read(path("tokenizer300.bin")).digest();
  const std::string other = nn::Tokenizer::read(path("other300.bin")).digest();
  ASSERT_NE(trained, other);
  EXPECT_EQ(nn::readCheckpoint(path("gpt300.ckpt")).metadata.at("tokenizer_digest"), trained);
  CommandResult r = runCohort({"generate", "--checkpoint", path("gpt300.ckpt"), "--prompt", "the", "--tokens", "3",
                               "--tokenizer", path("other300.bin")});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(countLines(r.stderrText), 1) << r.describe();
  EXPECT_NE(r.stderrText.find("warning: " + path("other300.bin") + " is tokenizer " + other +
                              ", but the checkpoint was trained with tokenizer " + trained),
            std::string::npos)
      << r.describe();
  EXPECT_EQ(r.stdoutText.rfind("the", 0), 0u) << r.describe();
  // `cohort export --format hf` carries the digest, and generate reads it from the export too.
  CommandResult exported = runCohort({"export", "--format", "hf", path("gpt300.ckpt"), path("gpt300-hf")});
  ASSERT_EQ(exported.exitCode, 0) << exported.describe();
  EXPECT_EQ(nn::readSafetensors(path("gpt300-hf/model.safetensors")).metadata.at("cohort_tokenizer_digest"), trained);
  for (const char* tokenizer : {"other300.bin", "tokenizer300.bin"}) {
    CommandResult hf = runCohort({"generate", "--checkpoint", path("gpt300-hf"), "--prompt", "the", "--tokens", "3",
                                  "--tokenizer", path(tokenizer)});
    ASSERT_EQ(hf.exitCode, 0) << hf.describe();
    const bool other = std::string(tokenizer) == "other300.bin";
    EXPECT_EQ(hf.stderrText.find("warning: " + path(tokenizer) + " is tokenizer") != std::string::npos, other)
        << hf.describe();
    if (!other) EXPECT_EQ(hf.stderrText, "") << hf.describe();
  }
  // gpt.ckpt was trained on text:, without a tokenizer: it records none.
  EXPECT_EQ(nn::readCheckpoint(path("gpt.ckpt")).metadata.count("tokenizer_digest"), 0u);
}

TEST_F(GenerateCliTest, BadInputExits2WithOneLineNamingTheProblem) {
  struct Case {
    std::vector<std::string> args;  // after "generate"
    std::string phrase;             // expected in the one stderr line
  };
  const std::string gpt = path("gpt.ckpt");
  const std::vector<Case> cases = {
      {{"--checkpoint", path("mlp.ckpt"), "--prompt", "hi", "--tokens", "3"},
       "holds model mlp:784,16,10, but generate needs a gpt: model"},
      {{"--checkpoint", gpt, "--prompt", "", "--tokens", "3"}, "--prompt is empty"},
      {{"--checkpoint", gpt, "--prompt", "hi", "--tokens", "0"}, "--tokens must be positive, got 0"},
      {{"--checkpoint", gpt, "--prompt", "hi", "--tokens", "-4"}, "--tokens must be positive, got -4"},
      {{"--checkpoint", gpt, "--prompt", "hi", "--tokens", "3", "--temperature", "0"},
       "--temperature must be positive and finite, got 0"},
      {{"--checkpoint", gpt, "--prompt", "hi", "--tokens", "3", "--temperature", "-0.5"},
       "--temperature must be positive and finite, got -0.5"},
      {{"--checkpoint", gpt, "--prompt", "hi", "--tokens", "3", "--top-k", "-1"},
       "--top-k must be 0 (all tokens) or positive, got -1"},
      {{"--checkpoint", path("none.ckpt"), "--prompt", "hi", "--tokens", "3"}, path("none.ckpt") + ": cannot open"},
      {{"--checkpoint", gpt, "--prompt", "hi"}, "--tokens is required"},
      // Issue 33: a negative seed used to wrap silently.
      {{"--checkpoint", gpt, "--prompt", "hi", "--tokens", "3", "--seed", "-1"},
       "--seed must be a whole number 0..18446744073709551615, got '-1'"},
      {{"--checkpoint", gpt, "--prompt", "hi", "--prompt-tokens", "1", "--tokens", "3"}, "not both"},
      {{"--checkpoint", path("gpt300.ckpt"), "--prompt", "hi", "--tokens", "3"},
       "has a vocabulary of 300 tokens, not bytes: give --tokenizer to encode --prompt, or the prompt as ids"},
      {{"--checkpoint", path("gpt300.ckpt"), "--prompt-tokens", "1,x", "--tokens", "3"},
       "--prompt-tokens: 'x' is not a token id of model"},
      {{"--checkpoint", path("gpt300.ckpt"), "--prompt-tokens", "300", "--tokens", "3"}, "'300' is not a token id"},
      {{"--checkpoint", path("gpt300.ckpt"), "--prompt-tokens", "1", "--tokens", "3", "--tokenizer",
        path("tokenizer100.bin")},
       "is a tokenizer of 100 tokens, but model"},
      {{"--checkpoint", path("gpt300.ckpt"), "--prompt-tokens", "1", "--tokens", "3", "--tokenizer", path("text.txt")},
       "not a tokenizer file"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {"generate"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    CommandResult r = runCohort(argv);
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_EQ(countLines(r.stderrText), 1) << r.describe();
    EXPECT_NE(r.stderrText.find(c.phrase), std::string::npos) << "expected \"" << c.phrase << "\"\n" << r.describe();
    EXPECT_EQ(r.stdoutText, "") << r.describe();
  }
}

}  // namespace
}  // namespace cohort::testing
