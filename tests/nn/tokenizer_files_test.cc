// The tokenizer files GPT-2's users have (nn/tokenizer_files.h), made here from GPT-2's ranks (npm's
// tiktoken, tests/nn/tiktoken_reference.h) in each format: llm.c's .bin (versions 1 and 2),
// HuggingFace's tokenizer.json (merges as "a b" and as pairs) and vocab.json + merges.txt, and
// tiktoken's .tiktoken. Each reads to the same vocabulary, digest and encoder, as a file and as a
// directory; each kind of malformed file gets one error naming the file and what is wrong.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "nn/tokenizer.h"
#include "nn/tokenizer_files.h"
#include "runtime/error.h"
#include "tests/nn/tiktoken_reference.h"
#include "tests/support/process.h"

namespace cohort::nn {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

void writeFile(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  ASSERT_TRUE(out.flush()) << path;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string hfText(const std::string& bytes) {
  std::string text;
  for (const char c : bytes) text += gpt2ByteToChar(static_cast<unsigned char>(c));
  return text;
}

// The two tokens whose merge makes token `rank`: the token's bytes merged by the test's own
// (quadratic, obviously right) BPE with only the ranks below it.
std::pair<std::string, std::string> mergeOf(const std::string& token, uint32_t rank,
                                            const std::unordered_map<std::string, uint32_t>& ranks) {
  std::vector<std::string> parts;
  for (const char c : token) parts.emplace_back(1, c);
  for (;;) {
    uint32_t best = rank;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = ranks.find(parts[i] + parts[i + 1]);
      if (it != ranks.end() && it->second < best) best = it->second, at = i;
    }
    if (best == rank) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  EXPECT_EQ(parts.size(), 2u) << "token " << rank;
  return {parts.front(), parts.back()};
}

std::string llmcFile(const Vocabulary& v, uint32_t version) {
  std::vector<uint32_t> header(256, 0);
  header[0] = 20240328, header[1] = version, header[2] = static_cast<uint32_t>(v.tokens.size());
  header[3] = version == 2 ? static_cast<uint32_t>(v.eotId) : 0;
  std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  for (const std::string& t : v.tokens) bytes += static_cast<char>(t.size()) + t;
  return bytes;
}

class TokenizerFilesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(testing::freshTempDir());
    const std::string ranks = testing::gpt2RanksFile(*dir_);
    if (ranks.empty()) return;
    gpt2_ = new Tokenizer(Tokenizer::read(ranks));
    writeFormats(gpt2_->vocabulary());
  }
  static void TearDownTestSuite() {
    delete gpt2_;
    delete dir_;
    gpt2_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(gpt2_, nullptr) << "GPT-2's ranks from npm's tiktoken could not be read"; }

  // One folder per format under dir_, each holding what GPT-2's users have.
  static void writeFormats(const Vocabulary& v) {
    std::unordered_map<std::string, uint32_t> ranks;
    for (uint32_t r = 0; r < v.tokens.size(); ++r) {
      if (r != v.eotId) ranks.emplace(v.tokens[r], r);
    }
    Json vocab = Json::object(), mergeLines = Json::array(), mergePairs = Json::array();
    std::string mergesTxt = "#version: 0.2\n";
    for (uint32_t r = 0; r < v.tokens.size(); ++r) {
      vocab[r == v.eotId ? v.tokens[r] : hfText(v.tokens[r])] = r;
      if (r == v.eotId || v.tokens[r].size() < 2) continue;
      const auto [a, b] = mergeOf(v.tokens[r], r, ranks);
      mergeLines.push_back(hfText(a) + " " + hfText(b));
      mergePairs.push_back({hfText(a), hfText(b)});
      mergesTxt += hfText(a) + " " + hfText(b) + "\n";
    }
    const Json added = Json::array({{{"id", v.eotId}, {"content", kEndOfText}, {"special", true}}});
    auto tokenizerJson = [&](const Json& merges) {
      return Json{{"added_tokens", added}, {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}}.dump();
    };
    writeFile(*dir_ + "/json/tokenizer.json", tokenizerJson(mergeLines));
    writeFile(*dir_ + "/json_pairs/tokenizer.json", tokenizerJson(mergePairs));
    writeFile(*dir_ + "/vocab/vocab.json", vocab.dump());
    writeFile(*dir_ + "/vocab/merges.txt", mergesTxt);
    writeFile(*dir_ + "/llmc/gpt2_tokenizer.bin", llmcFile(v, 2));
    writeFile(*dir_ + "/llmc1/gpt2_tokenizer.bin", llmcFile(v, 1));
    writeFile(*dir_ + "/tiktoken/r50k_base.tiktoken", readFile(*dir_ + "/gpt2.tiktoken"));
  }

  static std::string* dir_;
  static Tokenizer* gpt2_;
};

std::string* TokenizerFilesTest::dir_ = nullptr;
Tokenizer* TokenizerFilesTest::gpt2_ = nullptr;

TEST_F(TokenizerFilesTest, GptTwosByteMapIsHuggingFaces) {
  EXPECT_EQ(gpt2ByteToChar(' '), "\u0120");   // "Ġ"
  EXPECT_EQ(gpt2ByteToChar('\n'), "\u010a");  // "Ċ"
  EXPECT_EQ(gpt2ByteToChar(0), "\u0100");
  EXPECT_EQ(gpt2ByteToChar(0xAD), "\u0143");  // the last of the 68 moved bytes
  EXPECT_EQ(gpt2ByteToChar('!'), "!");
  EXPECT_EQ(gpt2ByteToChar(0xFF), "\u00ff");
}

// Every format, read as a file and as its folder: GPT-2's 50257 tokens, <|endoftext|> at 50256,
// one digest, the same ids.
TEST_F(TokenizerFilesTest, EveryFormatReadsToTheSameTokenizer) {
  const std::string text = readFile("/usr/share/common-licenses/GPL-3") + " 日本語 😀 e\u0301 <|endoftext|> 's";
  const std::vector<int32_t> expected = gpt2_->encode(text);
  const std::vector<std::pair<std::string, std::string>> formats = {
      {"json/tokenizer.json", "tokenizer.json"}, {"json_pairs/tokenizer.json", "tokenizer.json"},
      {"vocab/vocab.json", "vocab.json"},         {"llmc/gpt2_tokenizer.bin", "llm.c"},
      {"llmc1/gpt2_tokenizer.bin", "llm.c"},      {"tiktoken/r50k_base.tiktoken", "tiktoken"}};
  for (const auto& [file, format] : formats) {
    for (const std::string& path : {*dir_ + "/" + file, (fs::path(*dir_ + "/" + file).parent_path()).string()}) {
      const Tokenizer t = Tokenizer::read(path);
      EXPECT_EQ(t.vocabulary().format, format) << path;
      EXPECT_EQ(t.vocabulary().path, *dir_ + "/" + file) << path;
      EXPECT_EQ(t.size(), 50257) << path;
      EXPECT_EQ(t.eotId(), 50256) << path;
      EXPECT_EQ(t.vocabulary().tokens, gpt2_->vocabulary().tokens) << path;
      EXPECT_EQ(t.digest(), gpt2_->digest()) << path;
      EXPECT_EQ(t.encode(text), expected) << path;
      EXPECT_EQ(t.encodeWithSpecial("a<|endoftext|>"), (std::vector<int32_t>{64, 50256})) << path;
    }
  }
}

// Each malformed file: one InvalidArgument (IoError for an unreadable one) naming it and the fault.
TEST_F(TokenizerFilesTest, MalformedFilesAreRefusedWithTheFileAndTheFault) {
  const std::string bad = *dir_ + "/bad";
  const Vocabulary& v = gpt2_->vocabulary();
  std::string truncated = llmcFile(v, 2);
  truncated.resize(truncated.size() - 3);
  std::string version3 = llmcFile(v, 2);
  version3[4] = 3;
  const std::string vocab = readFile(*dir_ + "/vocab/vocab.json");
  std::string swapped = readFile(*dir_ + "/vocab/merges.txt");
  const size_t second = swapped.find('\n', swapped.find('\n') + 1) + 1;  // merges 1 and 2 swapped
  const size_t third = swapped.find('\n', second) + 1;
  swapped = swapped.substr(0, swapped.find('\n') + 1) + swapped.substr(second, third - second) +
            swapped.substr(swapped.find('\n') + 1, second - swapped.find('\n') - 1) + swapped.substr(third);
  struct Case {
    std::string name, bytes, fault;
    std::string named = "";  // the file the error names, when not `name` (merges.txt beside a vocab.json)
  };
  const std::vector<Case> cases = {
      {"empty.tiktoken", "", "not a tokenizer file"},
      {"text.txt", "Some text, not a tokenizer.\n", "not a tokenizer file"},
      {"truncated.bin", truncated, "ends inside token 50256 of the 50257"},
      {"v3.bin", version3, "llm.c tokenizer of version 3"},
      {"short.bin", std::string("\xc8\xd7\x34\x01", 4) + "abc", "shorter than a tokenizer's header"},
      {"repeat.tiktoken", "IQ== 0\nIg== 0\n", "rank 0 is given twice (line 2)"},
      {"gap.tiktoken", "IQ== 0\nIg== 2\n", "no token has rank 1"},
      {"base64.tiktoken", "IQ== 0\nI*== 1\n", "line 2 is not \"<base64 bytes> <rank>\""},
      {"notjson/vocab.json", "{\"a\": 1,", "not valid JSON"},
      {"ids/vocab.json", "{\"a\": 0, \"b\": 5}", "token \"b\" has id 5, not one of 0..1"},
      {"nomerges/vocab.json", vocab, "no merges.txt beside it"},
      {"model/tokenizer.json", "{\"model\": {\"type\": \"WordPiece\"}}", "\"model\" is not a BPE model"},
      {"char/vocab.json", "{\"\\u4e00\": 0}", "token \"\u4e00\" holds a character outside GPT-2's byte map"},
      {"order/vocab.json", vocab, "merge 2 makes id 256, not above the previous merge's 257", "order/merges.txt"},
  };
  writeFile(bad + "/order/merges.txt", swapped);
  writeFile(bad + "/char/merges.txt", "");
  for (const Case& c : cases) {
    writeFile(bad + "/" + c.name, c.bytes);
    try {
      Tokenizer::read(bad + "/" + c.name);
      ADD_FAILURE() << c.name << " was read";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(bad + "/" + (c.named.empty() ? c.name : c.named)), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(c.fault), std::string::npos) << c.name << ": " << e.what();
    }
  }
  EXPECT_THROW(Tokenizer::read(bad + "/missing.bin"), IoError);
  // A vocabulary without every byte decodes, and refuses to encode.
  writeFile(bad + "/bytes.tiktoken", "IQ== 0\nIg== 1\n");
  const Tokenizer twoBytes = Tokenizer::read(bad + "/bytes.tiktoken");
  EXPECT_EQ(twoBytes.decode(1), "\"");
  try {
    twoBytes.encode("!");
    ADD_FAILURE() << "a vocabulary of two bytes encoded";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(bad + "/bytes.tiktoken: cannot encode: byte 0 is not a token"), std::string::npos)
        << e.what();
  }
  fs::create_directories(bad + "/emptydir");
  EXPECT_THROW(
      {
        try {
          Tokenizer::read(bad + "/emptydir");
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("holds no tokenizer"), std::string::npos) << e.what();
          throw;
        }
      },
      InvalidArgument);
}

}  // namespace
}  // namespace cohort::nn
