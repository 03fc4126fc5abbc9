// CorpusReader and tokenizeCorpus (nn/corpus_reader.h, nn/corpus_tokenizer.h) with GPT-2's ranks
// (npm's tiktoken, tests/nn/tiktoken_reference.h): a document read in pieces as small as the batch
// size allows (1 to 4096 bytes) encodes to the ids of the whole, on text made to be hard for the
// pattern's whitespace rules; lines and JSON lines come as documents with their line numbers and
// input offsets; tokenizeCorpus gives the same ids with 1 and 3 threads over many small batches.
#include "nn/corpus_reader.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "nn/corpus_tokenizer.h"
#include "nn/tokenizer.h"
#include "tests/nn/tiktoken_reference.h"

namespace cohort::nn {
namespace {

void write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  ASSERT_TRUE(out.good()) << path;
}

// Whitespace of every kind next to every kind of character.
std::string hardText() {
  std::string text;
  const std::vector<std::string> parts = {"word", " ", "  ", "\n", "\n\n", " \n ", "\t", "\r\n", "\u00a0", "\u3000",
                                          "\u2028", "\u0085", "\u4f60\u597d", "\U0001F600", "e\u0301", "42", "'s",
                                          "'LL", "!?", "<|endoftext|>", "\xff", "\xc3", "  x", "   \n\n  y"};
  for (size_t i = 0; i < 3000; ++i) text += parts[(i * 7 + i / 24) % parts.size()];
  return text;
}

std::vector<CorpusBatch> readAll(CorpusReaderOptions options) {
  CorpusReader reader(std::move(options));
  std::vector<CorpusBatch> batches;
  CorpusBatch batch;
  while (reader.next(batch)) batches.push_back(batch);
  return batches;
}

class CorpusReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cohort::testing::freshTempDir();
    const std::string ranks = cohort::testing::gpt2RanksFile(dir_);
    ASSERT_FALSE(ranks.empty());
    tokenizer_ = Tokenizer::read(ranks);
  }
  std::string dir_;
  Tokenizer tokenizer_;
};

TEST_F(CorpusReaderTest, PiecesOfADocumentEncodeAsTheWhole) {
  const std::string text = hardText();
  write(dir_ + "/doc.txt", text);
  const std::vector<int32_t> whole = tokenizer_.encode(text);
  for (size_t batchBytes : {1, 2, 3, 5, 16, 100, 4096}) {
    std::vector<int32_t> ids;
    size_t pieces = 0;
    std::string joined;
    for (const CorpusBatch& batch : readAll({.paths = {dir_ + "/doc.txt"}, .batchBytes = batchBytes})) {
      for (const CorpusSegment& s : batch.segments) {
        EXPECT_EQ(s.startsDocument, pieces == 0);
        const std::string piece = batch.bytes.substr(s.offset, s.size);
        EXPECT_EQ(s.inputOffset, static_cast<int64_t>(joined.size()));
        joined += piece;
        const std::vector<int32_t> part = tokenizer_.encode(piece);
        ids.insert(ids.end(), part.begin(), part.end());
        ++pieces;
      }
    }
    EXPECT_EQ(joined, text) << batchBytes;
    EXPECT_GT(pieces, batchBytes < 100 ? 100u : 1u) << batchBytes;
    EXPECT_TRUE(ids == whole) << "batch bytes " << batchBytes << ": " << ids.size() << " ids, " << whole.size()
                              << " for the whole";
  }
}

TEST_F(CorpusReaderTest, LinesAndJsonLinesAreDocumentsWithTheirPlace) {
  write(dir_ + "/a.txt", "one\n\ntwo two\nthree");
  write(dir_ + "/b.jsonl", "{\"text\": \"x\"}\n  \n{\"text\": \"y\"}\n");
  CorpusReaderOptions options{.paths = {dir_ + "/a.txt", dir_ + "/b.jsonl"}, .form = DocumentForm::kLine};
  std::vector<std::string> texts;
  std::vector<int64_t> lines, offsets;
  for (const CorpusBatch& batch : readAll(options)) {
    for (const CorpusSegment& s : batch.segments) {
      EXPECT_TRUE(s.startsDocument);
      texts.push_back(batch.bytes.substr(s.offset, s.size));
      lines.push_back(s.line);
      offsets.push_back(s.inputOffset);
    }
  }
  EXPECT_EQ(texts, (std::vector<std::string>{"one", "two two", "three", "{\"text\": \"x\"}", "  ", "{\"text\": \"y\"}"}));
  EXPECT_EQ(lines, (std::vector<int64_t>{1, 3, 4, 1, 2, 3}));
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 5, 13, 18, 32, 35}));
  options.form = DocumentForm::kAuto;  // a.txt whole, b.jsonl by JSON lines (the blank one skipped)
  texts.clear();
  for (const CorpusBatch& batch : readAll(options)) {
    for (const CorpusSegment& s : batch.segments) texts.push_back(batch.bytes.substr(s.offset, s.size) + (s.json ? " (json)" : ""));
  }
  EXPECT_EQ(texts, (std::vector<std::string>{"one\n\ntwo two\nthree", "{\"text\": \"x\"} (json)", "{\"text\": \"y\"} (json)"}));
}

TEST_F(CorpusReaderTest, ThreadsGiveTheSameIdsInOrder) {
  std::string jsonl;
  for (int i = 0; i < 400; ++i) jsonl += "{\"text\": \"document " + std::to_string(i) + " \\u00e9\\ud83d\\ude00 " + std::string(i % 37, 'a') + "\"}\n";
  write(dir_ + "/c.jsonl", jsonl);
  write(dir_ + "/d.txt", hardText());
  auto run = [&](int threads) {
    CorpusReader reader({.paths = {dir_ + "/c.jsonl", dir_ + "/d.txt"}, .batchBytes = 64});
    std::vector<uint16_t> ids;
    size_t batches = 0, documents = 0;
    tokenizeCorpus(reader, tokenizer_, {.threads = threads}, [&](const EncodedBatch& b) {
      for (const auto& d : b.documents) EXPECT_EQ(b.tokens[d.token], 50256);
      ids.insert(ids.end(), b.tokens.begin(), b.tokens.end());
      ++batches;
      documents += b.documents.size();
    });
    EXPECT_GT(batches, 100u);
    EXPECT_EQ(documents, 401u);
    return ids;
  };
  const std::vector<uint16_t> one = run(1);
  // The expected ids, from the tokenizer alone.
  std::vector<uint16_t> expected;
  for (int i = 0; i < 400; ++i) {
    expected.push_back(50256);
    for (int32_t id : tokenizer_.encode("document " + std::to_string(i) + " \u00e9\U0001F600 " + std::string(i % 37, 'a'))) expected.push_back(static_cast<uint16_t>(id));
  }
  expected.push_back(50256);
  for (int32_t id : tokenizer_.encode(hardText())) expected.push_back(static_cast<uint16_t>(id));
  EXPECT_TRUE(one == expected);
  EXPECT_TRUE(run(3) == one);
}

}  // namespace
}  // namespace cohort::nn
