#include "runtime/data/text.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "runtime/error.h"
#include "tests/runtime/data/test_util.h"

namespace cohort::runtime::data {
namespace {

using testing::freshTempDir;
using testing::messageOf;
using testing::writeFile;

// 1000 bytes: 900 of train, the last 100 the test split.
std::string corpus() {
  std::string s;
  for (int i = 0; i < 1000; ++i) s += static_cast<char>('a' + (i * 7 + i / 13) % 26);
  return s;
}

// Every sample is context + 1 consecutive bytes of its split: inputs the first context, targets the
// same shifted by one.
TEST(Text, WindowsAreConsecutiveBytesOfTheirSplit) {
  const std::string text = corpus();
  for (Split split : {Split::kTrain, Split::kTest}) {
    auto d = textDataset(text, "c.txt", {.context = 8, .seed = 3}, split);
    EXPECT_EQ(d->numClasses(), 256);
    ASSERT_EQ(d->sampleShape(), (Shape{8}));
    ASSERT_EQ(d->targetShape(), (Shape{8}));
    const size_t begin = split == Split::kTrain ? 0 : 900, end = split == Split::kTrain ? 900 : 1000;
    for (int64_t w = 0; w < d->size(); ++w) {
      std::string window;
      for (int t = 0; t < 8; ++t) window += static_cast<char>(d->inputs().at(w * 8 + t));
      window += static_cast<char>(d->targets().at(w * 8 + 7));
      for (int t = 0; t + 1 < 8; ++t) EXPECT_EQ(d->targets().at(w * 8 + t), d->inputs().at(w * 8 + t + 1));
      const size_t at = text.find(window, begin);
      ASSERT_NE(at, std::string::npos) << "window " << w;
      EXPECT_LE(at + 9, end) << "window " << w << " crosses its split";
    }
  }
}

// Train: (900 - 1) / 8 windows at offsets drawn from the seed; test: the consecutive windows.
TEST(Text, TrainOffsetsFollowTheSeedAndTestIsConsecutive) {
  const std::string text = corpus();
  auto a = textDataset(text, "c.txt", {.context = 8, .seed = 3}, Split::kTrain);
  auto b = textDataset(text, "c.txt", {.context = 8, .seed = 3}, Split::kTrain);
  auto c = textDataset(text, "c.txt", {.context = 8, .seed = 4}, Split::kTrain);
  EXPECT_EQ(a->size(), 112);
  bool same = true, differ = false;
  for (int64_t i = 0; i < a->inputs().numel(); ++i) {
    same &= a->inputs().at(i) == b->inputs().at(i);
    differ |= a->inputs().at(i) != c->inputs().at(i);
  }
  EXPECT_TRUE(same);
  EXPECT_TRUE(differ);
  auto test = textDataset(text, "c.txt", {.context = 8, .seed = 3}, Split::kTest);
  ASSERT_EQ(test->size(), 12);  // (100 - 1) / 8
  for (int64_t w = 0; w < test->size(); ++w) {
    EXPECT_EQ(test->inputs().at(w * 8), static_cast<float>(static_cast<unsigned char>(text[900 + w * 8]))) << w;
  }
  EXPECT_EQ(test->name(), "text:c.txt/test");
}

TEST(Text, TooShortFilesAndMissingFilesAreClearErrors) {
  EXPECT_THROW(textDataset(std::string(50, 'x'), "short.txt", {.context = 8}, Split::kTrain), InvalidArgument);
  try {
    textDataset(std::string(50, 'x'), "short.txt", {.context = 8}, Split::kTrain);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("needs at least 90 bytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(textDataset(corpus(), "c.txt", {.context = 0}, Split::kTrain), InvalidArgument);
  EXPECT_THROW(readText({.path = "/nonexistent/x.txt", .context = 8}, Split::kTrain), IoError);
  const std::string dir = freshTempDir();
  writeFile(dir + "/c.txt", corpus());
  EXPECT_EQ(readText({.path = dir + "/c.txt", .context = 8, .seed = 3}, Split::kTest)->size(), 12);
  // Through openDataset: text needs a language model's context.
  EXPECT_THROW(openDataset("text:" + dir + "/c.txt", Split::kTrain), InvalidArgument);
  EXPECT_EQ(openDataset("text:" + dir + "/c.txt", Split::kTrain, {.context = 8, .seed = 3})->size(), 112);
}

// Issue 33: a directory once failed with the stream library's "basic_filebuf::underflow error"
// (exit 1) and /dev/zero was read until memory ran out; both are refused before reading.
TEST(Text, RefusesWhatIsNotARegularFile) {
  const std::string dir = freshTempDir();
  EXPECT_EQ(messageOf<IoError>([&] { openDataset("text:" + dir, Split::kTrain, {.context = 8}); }),
            dir + ": is a directory, not a regular file");
  EXPECT_EQ(messageOf<IoError>([&] { readText({.path = "/dev/null", .context = 8}, Split::kTest); }),
            "/dev/null: is a character device, not a regular file");
}

}  // namespace
}  // namespace cohort::runtime::data
