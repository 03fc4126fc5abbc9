// nn::Tokenizer against tiktoken's GPT-2 (npm's package, run by Node: tests/nn/tiktoken_reference.h):
// the same ids on a corpus made to be hard, on every Unicode scalar value in several contexts and on
// every text file under /usr/share/common-licenses; decode(encode(x)) == x for any bytes, UTF-8 or
// not; <|endoftext|> ordinary in encode() and special in encodeWithSpecial(); one encoder per thread.
// GPT-2's ranks come from npm's package at test time (nothing of GPT-2's vocabulary is in the repository).
#include "nn/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "tests/nn/tiktoken_reference.h"
#include "tests/support/alloc_counter.h"
#include "tests/support/process.h"

namespace cohort::nn {
namespace {

using testing::freshTempDir;
using testing::tiktokenEncode;

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += {static_cast<char>(0xC0 | cp >> 6), static_cast<char>(0x80 | (cp & 0x3F))};
  } else if (cp < 0x10000) {
    s += {static_cast<char>(0xE0 | cp >> 12), static_cast<char>(0x80 | (cp >> 6 & 0x3F)),
          static_cast<char>(0x80 | (cp & 0x3F))};
  } else {
    s += {static_cast<char>(0xF0 | cp >> 18), static_cast<char>(0x80 | (cp >> 12 & 0x3F)),
          static_cast<char>(0x80 | (cp >> 6 & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
  }
  return s;
}

void writeFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  ASSERT_TRUE(out.flush()) << path;
}

// Text made to be hard for GPT-2's pattern and merges: contractions in both cases, CJK, emoji and
// other 4-byte characters, combining marks, Unicode's other spaces, runs of spaces and newlines,
// digits, punctuation runs, <|endoftext|> inside the text, and pieces long enough (> 256 bytes) for
// the heap merge.
std::string hardCorpus() {
  std::string s =
      "It's don't they're we've I'm you'll he'd IT'S DON'T THEY'RE WE'VE I'M YOU'LL HE'D 's 't 're 've 'm 'll 'd\n"
      "'S 'T 'RE 'VE 'M 'LL 'D ''s '''t x's\t's\n's  's's\n"
      "日本語のテキストと中文文本，한국어 텍스트。 東京 2024年\n"
      "emoji 😀😃🙂 👩‍👩‍👧‍👦 🇩🇪🇫🇷 a😀b 😀1 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈𐌰 🎉🎉🎉\n"
      "combining: e\u0301 a\u0308\u0304 Z\u0335\u0321\u0327a\u0337\u0322l\u0336g\u0338o \u0301\u0301 n\u0303\n"
      "spaces:  two   three    four\t\ttabs \t mixed\u00a0nbsp\u3000ideo\u2003em\u2009thin\u200bzw\u0085nel\u180emvs\n"
      "\n\n\n   \n  \n\r\n\r\r\n \n\n"
      "digits 0 12 345 6789 3.14159 1,000,000 ١٢٣ ४५६ ½ Ⅻ ²³ 0x1F\n"
      "punct !!! ??? ... --- === <<<>>> @#$%^&*() ~`| \\/ \"quoted\" 'single' «guillemets» —dash–\n"
      "<|endoftext|> in text, and <|endoftext|>twice<|endoftext|> <|endoftext\n"
      "mixed: abc123def 123abc a1b2c3 Hello,World! hello.world CamelCaseWord snake_case_word\n"
      "Ελληνικά Русский текст עברית العربية हिन्दी ไทย\n"
      "    indented code\n        deeper();\n\tif (x) { return y; }\n"
      "trailing spaces   \n";
  s += std::string(3000, '7') + " " + std::string(600, ' ') + "x" + std::string(700, '!') + "\n";
  for (int i = 0; i < 300; ++i) s += "ab"[i % 2];
  s += " ";
  for (int i = 0; i < 500; ++i) s += "the"[i % 3];
  s += '\n';
  s += std::string(400, ' ');
  s += std::string(300, '\n');
  s += "end   ";
  return s;
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(freshTempDir());
    const std::string ranks = testing::gpt2RanksFile(*dir_);
    if (!ranks.empty()) gpt2_ = new Tokenizer(Tokenizer::read(ranks));
  }
  static void TearDownTestSuite() {
    delete gpt2_;
    delete dir_;
    gpt2_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(gpt2_, nullptr) << "GPT-2's ranks from npm's tiktoken could not be read"; }

  // Each text through tiktoken and through Cohort: the same ids, and decode gives the text back.
  void expectTiktokensIds(const std::vector<std::string>& texts, const std::string& name) {
    std::vector<std::string> files;
    for (size_t i = 0; i < texts.size(); ++i) {
      files.push_back(*dir_ + "/" + name + std::to_string(i) + ".txt");
      writeFile(files.back(), texts[i]);
    }
    const std::vector<std::vector<int32_t>> expected = tiktokenEncode(*dir_, files);
    ASSERT_EQ(expected.size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::vector<int32_t> ids = gpt2_->encode(texts[i]);
      ASSERT_TRUE(ids == expected[i]) << name << " text " << i << " (" << texts[i].size() << " bytes): "
                                      << firstDifference(ids, expected[i]);
      ASSERT_EQ(gpt2_->decode(ids), texts[i]) << name << " text " << i;
    }
  }

  // Where Cohort's ids leave tiktoken's, with the text of a few ids from there on either side.
  static std::string firstDifference(const std::vector<int32_t>& ours, const std::vector<int32_t>& theirs) {
    size_t k = 0;
    while (k < ours.size() && k < theirs.size() && ours[k] == theirs[k]) ++k;
    auto around = [k](const std::vector<int32_t>& ids) {
      const size_t from = k < 3 ? 0 : k - 3, to = std::min(ids.size(), k + 4);
      std::string text;
      for (size_t j = from; j < to; ++j) text += std::to_string(ids[j]) + "=\"" + gpt2_->decode(ids[j]) + "\" ";
      return text;
    };
    return "ids differ from id " + std::to_string(k) + " of " + std::to_string(ours.size()) + " (Cohort) and " +
           std::to_string(theirs.size()) + " (tiktoken); Cohort: " + around(ours) + "tiktoken: " + around(theirs);
  }

  static std::string* dir_;
  static Tokenizer* gpt2_;
};

std::string* TokenizerTest::dir_ = nullptr;
Tokenizer* TokenizerTest::gpt2_ = nullptr;

TEST_F(TokenizerTest, GptTwoFromNpmsRanks) {
  EXPECT_EQ(gpt2_->size(), 50257);
  EXPECT_EQ(gpt2_->eotId(), 50256);
  EXPECT_EQ(gpt2_->decode(50256), "<|endoftext|>");
  EXPECT_EQ(gpt2_->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(gpt2_->decode(50304), "<|50304|>");
}

// The hard corpus whole, and each of its lines alone (so each is at a text's start and end).
TEST_F(TokenizerTest, AHardCorpusEncodesAsTiktoken) {
  const std::string corpus = hardCorpus();
  std::vector<std::string> texts = {corpus};
  for (size_t at = 0; at < corpus.size();) {
    size_t end = corpus.find('\n', at);
    end = end == std::string::npos ? corpus.size() : end + 1;
    texts.push_back(corpus.substr(at, end - at));
    texts.push_back(corpus.substr(at, end - at - 1));
    at = end;
  }
  expectTiktokensIds(texts, "hard");
  // <|endoftext|> in a document is ordinary text: never the special id.
  const std::vector<int32_t> ids = gpt2_->encode("<|endoftext|>");
  EXPECT_EQ(ids.size(), 7u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 50256), 0);
}

// Every Unicode scalar value (surrogates are not) after a letter, a space, a digit, a tab and
// itself, and before a letter, a digit and spaces: each character's classes (\p{L}, \p{N},
// White_Space, the rest) are PCRE2's as they are tiktoken's.
TEST_F(TokenizerTest, EveryCodePointEncodesAsTiktoken) {
  std::vector<std::string> texts(4);
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const std::string c = utf8(cp);
    texts[cp * 4 / 0x110000] += "x" + c + c + " " + c + "7" + c + "a\t" + c + "  " + c + "\n";
  }
  expectTiktokensIds(texts, "codepoints");
}

TEST_F(TokenizerTest, EveryCommonLicenseEncodesAsTiktoken) {
  std::vector<std::string> texts;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/share/common-licenses")) {
    if (!entry.is_regular_file()) continue;  // follows links (GPL -> GPL-3): those are read too
    std::ifstream in(entry.path(), std::ios::binary);
    texts.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  ASSERT_GE(texts.size(), 10u) << "/usr/share/common-licenses holds fewer files than Debian's base-files has";
  expectTiktokensIds(texts, "license");
}

// Any bytes: random bytes (mostly not UTF-8), random mixes of UTF-8 pieces and stray bytes, long runs.
TEST_F(TokenizerTest, AnyBytesDecodeToThemselves) {
  std::mt19937 rng(47);
  const std::vector<std::string> fragments = {"a", " ", "'s", "日", "😀", "\xff", "\x80", "\xe6\x97", "\xf0\x9f\x98",
                                              "\n", "7", "\xc0\xaf", "\xed\xa0\x80", "e\u0301", "\u0085", "!"};
  for (int round = 0; round < 2000; ++round) {
    std::string text;
    const int length = static_cast<int>(rng() % 300);
    for (int i = 0; i < length; ++i) {
      text += round % 2 ? std::string(1, static_cast<char>(rng() & 0xFF)) : fragments[rng() % fragments.size()];
    }
    ASSERT_EQ(gpt2_->decode(gpt2_->encode(text)), text) << "round " << round;
    ASSERT_EQ(gpt2_->decode(gpt2_->encodeWithSpecial(text)), text) << "round " << round;
  }
  std::string all;
  for (int b = 0; b < 256; ++b) all += std::string(300, static_cast<char>(b));
  EXPECT_EQ(gpt2_->decode(gpt2_->encode(all)), all);
  EXPECT_TRUE(gpt2_->encode("").empty());
}

TEST_F(TokenizerTest, EncodeWithSpecialMakesEndOfTextItsId) {
  auto join = [](std::vector<std::vector<int32_t>> parts) {
    std::vector<int32_t> all;
    for (auto& p : parts) all.insert(all.end(), p.begin(), p.end());
    return all;
  };
  const int32_t eot = 50256;
  EXPECT_EQ(gpt2_->encodeWithSpecial("<|endoftext|>"), (std::vector<int32_t>{eot}));
  EXPECT_EQ(gpt2_->encodeWithSpecial("Hi<|endoftext|> there<|endoftext|><|endoftext|>"),
            join({gpt2_->encode("Hi"), {eot}, gpt2_->encode(" there"), {eot, eot}}));
  EXPECT_EQ(gpt2_->encodeWithSpecial("<|endoftext|"), gpt2_->encode("<|endoftext|"));
  EXPECT_EQ(gpt2_->decode(gpt2_->encodeWithSpecial("a<|endoftext|>b")), "a<|endoftext|>b");
}

// One Encoder over many texts (its cache of pieces warm) gives each text's fresh ids, and encoders
// on several threads at once give the same as one thread.
TEST_F(TokenizerTest, EncodersReusedAndOnThreadsGiveTheSameIds) {
  const std::string corpus = hardCorpus();
  std::vector<std::string> texts;
  for (size_t at = 0; at < corpus.size(); at += 97) texts.push_back(corpus.substr(at, 211));
  std::vector<std::vector<int32_t>> fresh;
  for (const std::string& t : texts) fresh.push_back(gpt2_->encode(t));
  auto encodeAll = [&](std::vector<std::vector<int32_t>>& out) {
    Tokenizer::Encoder encoder = gpt2_->encoder();
    for (int pass = 0; pass < 3; ++pass) {
      out.clear();
      for (const std::string& t : texts) {
        out.emplace_back();
        encoder.encode(t, out.back());
      }
    }
  };
  std::vector<std::vector<std::vector<int32_t>>> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results) threads.emplace_back(encodeAll, std::ref(r));
  for (auto& t : threads) t.join();
  for (const auto& r : results) EXPECT_EQ(r, fresh);
}

// An Encoder that has seen a text once allocates nothing to encode it again (nor a piece of it): the
// pattern's match state, the merge buffers and the cache are all reused.
TEST_F(TokenizerTest, AWarmEncoderAllocatesNothingPerPiece) {
  const std::string corpus = hardCorpus() + std::string(2000, 'z');  // long pieces: the heap merge too
  Tokenizer::Encoder encoder = gpt2_->encoder();
  std::vector<int32_t> ids;
  encoder.encode(corpus, ids);
  const size_t count = ids.size();
  ids.clear();
  ids.reserve(2 * count);  // the output's own growth is the caller's
  const long before = testing::allocationCount();
  encoder.encode(corpus, ids);
  encoder.encode(std::string_view(corpus).substr(1000, 5000), ids);
  EXPECT_EQ(testing::allocationCount() - before, 0);
  EXPECT_GE(ids.size(), count);
}

}  // namespace
}  // namespace cohort::nn
