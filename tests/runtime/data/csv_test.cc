#include "runtime/data/csv.h"

#include <gtest/gtest.h>

#include "runtime/error.h"
#include "tests/runtime/data/test_util.h"

namespace cohort::runtime::data {
namespace {

using testing::freshTempDir;
using testing::messageOf;
using testing::writeFile;

std::string parseError(const std::string& text) {
  return messageOf<IoError>([&] { parseCsv(text, "f.csv"); });
}

TEST(Csv, HeaderIsDetectedAndClassesCounted) {
  auto d = parseCsv("a,b,label\n1,2,0\n3,4,2\n", "f.csv");
  ASSERT_EQ(d->inputs().shape(), (Shape{2, 2}));
  ASSERT_EQ(d->targets().shape(), (Shape{2}));
  EXPECT_EQ(d->numClasses(), 3);
  EXPECT_EQ(d->inputs().at(0), 1.0f);
  EXPECT_EQ(d->inputs().at(3), 4.0f);
  EXPECT_EQ(d->targets().at(1), 2.0f);
  EXPECT_EQ(d->name(), "csv:f.csv");
}

TEST(Csv, NoHeader) {
  auto d = parseCsv("1,2,0\n3,4,1", "f.csv");  // no final newline
  EXPECT_EQ(d->size(), 2);
  EXPECT_EQ(d->numClasses(), 2);
  // A header with a number among its names is still a header.
  EXPECT_EQ(parseCsv("x1,2,y\n1,2,0\n", "f.csv")->size(), 1);
}

TEST(Csv, Regression) {
  auto d = parseCsv("0.5,1.5,2.25\n-1,2e3,-3\n", "f.csv");
  ASSERT_EQ(d->targets().shape(), (Shape{2, 1}));
  EXPECT_EQ(d->numClasses(), 0);
  EXPECT_EQ(d->targets().at(0), 2.25f);
  EXPECT_EQ(d->targets().at(1), -3.0f);
  EXPECT_EQ(d->inputs().at(3), 2000.0f);
  EXPECT_EQ(parseCsv("1,0.5\n", "f.csv")->numClasses(), 0);
  EXPECT_EQ(parseCsv("1,16777216\n", "f.csv")->numClasses(), 0);  // 2^24 is too large a class
  EXPECT_EQ(parseCsv("1,16777215\n", "f.csv")->numClasses(), 16777216);
}

TEST(Csv, CrlfSpacesAndTrailingBlankLines) {
  auto d = parseCsv("f1, f2 ,y\r\n 1 ,\t2,3\r\n4,5,1\r\n\r\n\n  \n", "f.csv");
  EXPECT_EQ(d->size(), 2);
  EXPECT_EQ(d->numClasses(), 4);
  EXPECT_EQ(d->inputs().at(1), 2.0f);
}

TEST(Csv, RaggedRow) {
  EXPECT_NE(parseError("1,2,3\n4,5\n").find("f.csv:2: expected 3 columns, got 2"),
            std::string::npos);
  EXPECT_NE(parseError("a,b\n1,2\n3,4\n5,6,7\n").find("f.csv:4: expected 2 columns, got 3"),
            std::string::npos);
}

TEST(Csv, NonNumericField) {
  std::string msg = parseError("1,2,3\n4,abc,1\n");
  EXPECT_NE(msg.find("f.csv:2: column 2: 'abc' is not a number"), std::string::npos) << msg;
  // Text is a header only on line 1.
  msg = parseError("h1,h2\n1,2\nx,y\n");
  EXPECT_NE(msg.find("f.csv:3: column 1: 'x' is not a number"), std::string::npos) << msg;
  for (const char* bad : {"nan", "inf", "-inf", "1.5x", "1e", "", "--1", "1e99"}) {
    msg = parseError(std::string("1,2\n3,") + bad + "\n");
    EXPECT_NE(msg.find("f.csv:2: column 2: '" + std::string(bad) + "' is not a number"),
              std::string::npos)
        << bad << ": " << msg;
  }
}

// Issue 15: the field was echoed raw, so a file's invalid UTF-8 and terminal escapes reached the
// log and the terminal. It is quoted through runtime::printable().
TEST(Csv, NonNumericFieldIsQuotedPrintably) {
  auto expectQuoted = [](const std::string& text, const std::string& quoted) {
    std::string msg = parseError(text);
    EXPECT_NE(msg.find(quoted), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\x1b'), std::string::npos) << msg;
    return msg;
  };
  expectQuoted("1,2\n3,\xff\xfez\n", R"(f.csv:2: column 2: '\xff\xfez' is not a number)");
  expectQuoted("1,2\n\x1b[31mred\x1b[0m,1\n", R"(column 1: '\x1b[31mred\x1b[0m' is not a number)");
  expectQuoted("1,2\n3,a\tb\n", R"('a\x09b')");
  expectQuoted("1,2\n3,na\xc3\xafve\n", "'na\xc3\xafve' is not a number");  // valid UTF-8 stays
  std::string msg = expectQuoted("1,2\n3," + std::string(1000, 'z') + "\n",
                                 "'" + std::string(64, 'z') + "... (1000 bytes)' is not a number");
  EXPECT_LT(msg.size(), 200u) << msg;
}

TEST(Csv, EmptyOrHeaderOnlyOrTooNarrow) {
  EXPECT_NE(parseError("").find("f.csv:1: empty file"), std::string::npos);
  EXPECT_NE(parseError("\n\r\n").find("empty file"), std::string::npos);
  EXPECT_NE(parseError("a,b,c\n").find("f.csv:1: a header but no data rows"), std::string::npos);
  EXPECT_NE(parseError("1\n2\n").find("at least 2 columns"), std::string::npos);
  EXPECT_NE(parseError("1,2\n\n3,4\n").find("f.csv:2: blank line"), std::string::npos);
}

TEST(Csv, ReadsFilesAndNamesThemInErrors) {
  std::string dir = freshTempDir();
  writeFile(dir + "/good.csv", "x,y\n1,0\n2,1\n");
  EXPECT_EQ(readCsv(dir + "/good.csv")->size(), 2);
  EXPECT_EQ(openDataset("csv:" + dir + "/good.csv", Split::kTrain)->numClasses(), 2);
  EXPECT_THROW(openDataset("csv:" + dir + "/good.csv", Split::kTest), InvalidArgument);

  writeFile(dir + "/bad.csv", "1,2\n3,oops\n");
  std::string msg = messageOf<IoError>([&] { readCsv(dir + "/bad.csv"); });
  EXPECT_NE(msg.find(dir + "/bad.csv:2: column 2: 'oops'"), std::string::npos) << msg;

  msg = messageOf<IoError>([&] { readCsv(dir + "/missing.csv"); });
  EXPECT_NE(msg.find(dir + "/missing.csv"), std::string::npos) << msg;
}

// Issue 33: a directory was reported as an "empty file"; devices are refused before reading.
TEST(Csv, RefusesWhatIsNotARegularFile) {
  std::string dir = freshTempDir();
  EXPECT_EQ(messageOf<IoError>([&] { openDataset("csv:" + dir, Split::kTrain); }),
            dir + ": is a directory, not a regular file");
  EXPECT_EQ(messageOf<IoError>([&] { readCsv("/dev/null"); }), "/dev/null: is a character device, not a regular file");
}

}  // namespace
}  // namespace cohort::runtime::data
