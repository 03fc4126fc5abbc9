// `cohort tokenize` (cli/tokenize_command.h) against shards written from tiktoken's ids by a writer of
// the test's own (tests/nn/tiktoken_gpt2.js `shards`: npm's tiktoken, JSON.parse, the documented val
// and shard rules), byte for byte, with --threads 1 and 2: a .jsonl (escapes, surrogate pairs, other
// fields), lines (empty ones, a line of more than a megabyte) and whole files (one of 2.4 MB, read
// and encoded in pieces; an empty one), each with a val split over several shards. The corpora hold
// text made to be hard for GPT-2's pattern (CJK, emoji, combining marks, Unicode spaces, runs of
// spaces and newlines, contractions, "<|endoftext|>" as text) between the licenses of
// /usr/share/common-licenses, and are a few megabytes, so that several batches are in flight at once.
// Bad input: invalid UTF-8 in a JSON string, no "text", bad JSON, a lone surrogate, each one line
// naming FILE:LINE and exit 2 (the first bad line of the input named, the shards already written
// removed); existing shards refused without --force; a tokenizer past uint16; a symbolic link as
// --out-dir.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"
#include "tests/nn/tiktoken_reference.h"

namespace cohort::testing {
namespace {

// Every license (the symbolic links left out: they name files that are there anyway).
std::string licenses() {
  std::string text;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/share/common-licenses")) {
    if (entry.is_regular_file() && !entry.is_symlink()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) text += readFile(f.string());
  return text;
}

// Text that is hard for GPT-2's pattern, varied by k.
std::string hardText(int k) {
  return "\n\n  \t  Hello  world's 'S 'T 'RE 'VE 'M 'LL 'D they'll I'd we've \u4f60\u597d\u4e16\u754c\u3002\n"
         "\u3000\u3000\u5168\u89d2 emoji \U0001F600\U0001F680 e\u0301 n\u0303 \u00a0nbsp\u00a0 \u2003em\u2028line "
         "<|endoftext|> 12345678 " + std::to_string(k * 7919) + "   \r\n\r\n    \n" + std::string(k % 5 + 1, ' ') +
         "x\u0085y \u200bz\n";
}

// `copies` times the licenses, hard text between them.
std::string corpus(int copies) {
  const std::string l = licenses();
  std::string text;
  for (int k = 0; k < copies; ++k) text += hardText(k) + l;
  return text;
}

struct Case {
  std::string split;                 // file, lines, jsonl
  std::vector<std::string> inputs;
  nlohmann::json val;                // {"valTokens": N} or {"valFraction": F}
  int64_t shardTokens = 0;
};

// Runs the reference writer and `cohort tokenize` with 1 and 2 threads; the shards must be the same files, byte for byte.
void expectSameAsTiktoken(const std::string& dir, const std::string& tokenizer, const Case& c) {
  const std::string ref = dir + "/ref";
  ASSERT_EQ(::mkdir(ref.c_str(), 0755), 0);
  nlohmann::json spec = {{"inputs", c.inputs}, {"split", c.split}, {"shardTokens", c.shardTokens}, {"outDir", ref},
                         {"name", "corpus"}};
  spec.update(c.val);
  writeFile(dir + "/spec.json", spec.dump());
  const CommandResult r = runTiktoken({"shards", dir + "/spec.json"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::vector<std::string> expected = listDir(ref);
  int val = 0, train = 0;
  for (const std::string& name : expected) (name.find("_val_") != std::string::npos ? val : train)++;
  ASSERT_GE(val, 1) << "the case must have a val split";
  ASSERT_GE(train, 2) << "the case must have several train shards";
  for (int threads : {1, 2}) {
    const std::string out = dir + "/out" + std::to_string(threads);
    std::vector<std::string> args = {"tokenize", "--tokenizer", tokenizer, "--out-dir", out, "--name", "corpus",
                                     "--split", c.split, "--shard-tokens", std::to_string(c.shardTokens),
                                     "--threads", std::to_string(threads)};
    for (const auto& [key, value] : c.val.items()) {
      args.push_back(key == "valTokens" ? "--val-tokens" : "--val-fraction");
      args.push_back(value.dump());
    }
    args.insert(args.end(), c.inputs.begin(), c.inputs.end());
    const CommandResult t = runCohort(args);
    ASSERT_EQ(t.exitCode, 0) << t.describe();
    EXPECT_EQ(t.stderrText, "");
    ASSERT_EQ(listDir(out), expected) << "threads " << threads;
    for (const std::string& name : expected) {
      const std::string want = readFile(ref + "/" + name), got = readFile(out + "/" + name);
      size_t at = 0;
      while (at < want.size() && at < got.size() && want[at] == got[at]) ++at;
      EXPECT_TRUE(want == got) << name << " with " << threads << " threads: " << got.size() << " bytes, expected "
                               << want.size() << "; first difference at byte " << at;
    }
  }
}

class TokenizeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = freshTempDir();
    tokenizer_ = gpt2RanksFile(dir_);
    ASSERT_FALSE(tokenizer_.empty());
  }
  std::string dir_, tokenizer_;
};

TEST_F(TokenizeTest, WholeFilesMatchTiktoken) {
  writeFile(dir_ + "/big.txt", corpus(8));  // 2.4 MB: one document, encoded in pieces
  writeFile(dir_ + "/empty.txt", "");
  writeFile(dir_ + "/hard.txt", hardText(3) + hardText(4) + "no newline at the end");
  expectSameAsTiktoken(dir_, tokenizer_,
                       {.split = "file", .inputs = {dir_ + "/hard.txt", dir_ + "/empty.txt", dir_ + "/big.txt"},
                        .val = {{"valTokens", 100}}, .shardTokens = 150000});
}

TEST_F(TokenizeTest, LinesMatchTiktoken) {
  std::string longLine = corpus(4);  // more than a megabyte without a '\n'
  for (char& c : longLine) c = c == '\n' ? ' ' : c;
  writeFile(dir_ + "/a.txt", corpus(5) + "\n\n\nlast line without newline");
  writeFile(dir_ + "/b.txt", "first\n" + longLine + "\n\n" + hardText(9));
  expectSameAsTiktoken(dir_, tokenizer_,
                       {.split = "lines", .inputs = {dir_ + "/a.txt", dir_ + "/b.txt"},
                        .val = {{"valFraction", 0.25}}, .shardTokens = 200000});
}

TEST_F(TokenizeTest, JsonLinesMatchTiktoken) {
  const std::string text = corpus(8);
  std::string lines;
  int64_t id = 0;
  for (size_t at = 0; at < text.size(); ++id) {
    const size_t size = 200 + static_cast<size_t>(id * 7919 % 3000);
    nlohmann::json doc = {{"meta", {{"text", "not this one"}, {"n", id}}}, {"text", text.substr(at, size)}, {"id", id}};
    // Both escaped (\uXXXX, surrogate pairs for emoji) and raw UTF-8 lines.
    lines += doc.dump(-1, ' ', id % 2 == 0) + (id % 50 == 0 ? "\n  \n" : "\n");
    at += size;
  }
  writeFile(dir_ + "/corpus.jsonl", lines);
  writeFile(dir_ + "/more.jsonl", "{\"text\": \"\\ud83d\\ude00 \\u00e9\\n\\t\\\"q\\\" <|endoftext|>\"}\n{\"text\": \"\"}");
  expectSameAsTiktoken(dir_, tokenizer_,
                       {.split = "jsonl", .inputs = {dir_ + "/corpus.jsonl", dir_ + "/more.jsonl"},
                        .val = {{"valTokens", 30000}}, .shardTokens = 100000});
}

// One bad line: exit 2, one line naming FILE:LINE and `problem`, no shard left behind.
void expectRefused(const std::string& dir, const std::string& tokenizer, const std::string& lines, int badLine,
                   const std::string& problem) {
  const std::string file = dir + "/bad.jsonl", out = dir + "/out";
  writeFile(file, lines);
  for (const char* threads : {"1", "2"}) {
    const CommandResult r = runCohort({"tokenize", "--tokenizer", tokenizer, "--out-dir", out, "--threads", threads,
                                       "--shard-tokens", "100000", file});
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_EQ(countLines(r.stderrText), 1) << r.describe();
    EXPECT_NE(r.stderrText.find(file + ":" + std::to_string(badLine) + ": " + problem), std::string::npos)
        << r.describe();
    EXPECT_EQ(listDir(out), std::vector<std::string>{}) << "the shards written before the bad line are removed";
  }
}

TEST_F(TokenizeTest, BadJsonLinesAreRefusedWithTheirPlace) {
  const std::string good = "{\"text\": \"fine\"}\n";
  expectRefused(dir_, tokenizer_, good + good + "{\"text\": \"ab\xff\"}\n", 3, "invalid UTF-8 at byte 13");
  expectRefused(dir_, tokenizer_, good + "{\"id\": 1}\n", 2, "no \"text\" string");
  expectRefused(dir_, tokenizer_, good + "{\"text\": 5}\n", 2, "no \"text\" string in the JSON object (\"text\" is number)");
  expectRefused(dir_, tokenizer_, "{\"text\": \"abc\"\n", 1, "bad JSON: ");
  expectRefused(dir_, tokenizer_, good + "[1, 2]\n", 2, "a JSON line must be an object");
  expectRefused(dir_, tokenizer_, good + "{\"text\": \"\\ud800 lone\"}\n", 2, "bad JSON: ");
  // Far into the input, after shards were written, and before another bad line in a later batch: the
  // first is named whatever the threads.
  std::string many;
  int line = 0;
  while (many.size() < 3'000'000) {
    many += "{\"text\": \"" + std::string(900, 'a' + line % 26) + " words\"}\n";
    ++line;
  }
  expectRefused(dir_, tokenizer_, many + "{\"id\": 2}\n" + many + "{oops}\n", line + 1, "no \"text\" string");
}

TEST_F(TokenizeTest, ExistingShardsNeedForce) {
  const std::string out = dir_ + "/data", input = dir_ + "/in.txt";
  writeFile(input, corpus(1));
  auto tokenize = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"tokenize", "--tokenizer", tokenizer_, "--out-dir", out, input};
    args.insert(args.end(), extra.begin(), extra.end());
    return runCohort(args);
  };
  CommandResult r = tokenize({"--shard-tokens", "20000"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::vector<std::string> many = listDir(out);
  ASSERT_GE(many.size(), 3u);
  EXPECT_EQ(many.front(), "data_train_000000.bin") << "the name is --out-dir's last component";
  r = tokenize({});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find("already holds"), std::string::npos) << r.describe();
  EXPECT_EQ(listDir(out), many);
  writeFile(out + "/other.bin", "kept");
  r = tokenize({"--force"});  // one shard of 100M tokens: the old ones it did not replace are removed
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(listDir(out), (std::vector<std::string>{"data_train_000000.bin", "other.bin"}));
}

// Not a terminal: plain lines, each whole, never a carriage return or an escape sequence.
TEST_F(TokenizeTest, ProgressIsPlainLinesOffATerminal) {
  writeFile(dir_ + "/in.txt", corpus(12));  // 3.6 MB: several batches
  const CommandResult r = runCohort({"tokenize", "--tokenizer", tokenizer_, "--out-dir", dir_ + "/out", "--threads", "1",
                                     "--progress-every", "0.001", dir_ + "/in.txt"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::vector<std::string> lines = linesWith(r.stdoutText, "tokenize: ");
  EXPECT_GE(lines.size(), 1u) << r.stdoutText;
  for (const std::string& line : lines) EXPECT_NE(line.find(" MB/s "), std::string::npos) << line;
  EXPECT_EQ(r.stdoutText.find_first_of("\r\x1b"), std::string::npos) << r.stdoutText;
  EXPECT_NE(r.stdoutText.find("train: "), std::string::npos) << r.stdoutText;
}

TEST_F(TokenizeTest, RefusesWhatDoesNotFit) {
  writeFile(dir_ + "/in.txt", "text");
  // 70000 tokens: the 256 bytes, then two-byte tokens.
  std::string ranks;
  static constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  auto base64 = [&](std::string bytes) {
    std::string s;
    bytes.append((3 - bytes.size() % 3) % 3, '\0');
    for (size_t i = 0; i < bytes.size(); i += 3) {
      const uint32_t v = static_cast<uint8_t>(bytes[i]) << 16 | static_cast<uint8_t>(bytes[i + 1]) << 8 | static_cast<uint8_t>(bytes[i + 2]);
      for (int k = 3; k >= 0; --k) s += kBase64[v >> (6 * k) & 63];
    }
    return s;
  };
  for (int id = 0; id < 70000; ++id) {
    const std::string token = id < 256 ? std::string(1, static_cast<char>(id))
                                       : std::string{static_cast<char>(id / 256 % 256), static_cast<char>(id % 256), static_cast<char>(id / 65536 + 'a')};
    ranks += base64(token) + " " + std::to_string(id) + "\n";
  }
  writeFile(dir_ + "/big.tiktoken", ranks);
  CommandResult r = runCohort({"tokenize", "--tokenizer", dir_ + "/big.tiktoken", "--out-dir", dir_ + "/o1", dir_ + "/in.txt"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_EQ(countLines(r.stderrText), 1) << r.describe();
  EXPECT_NE(r.stderrText.find("uint16"), std::string::npos) << r.describe();

  ASSERT_EQ(::symlink(dir_.c_str(), (dir_ + "/link").c_str()), 0);
  r = runCohort({"tokenize", "--tokenizer", tokenizer_, "--out-dir", dir_ + "/link/", dir_ + "/in.txt"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find("is a symbolic link"), std::string::npos) << r.describe();

  r = runCohort({"tokenize", "--tokenizer", tokenizer_, "--out-dir", dir_ + "/o2", "--val-tokens", "5",
                 "--val-fraction", "0.1", dir_ + "/in.txt"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find("not both"), std::string::npos) << r.describe();
}

}  // namespace
}  // namespace cohort::testing
