#include "runtime/data/mnist.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cstdio>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "tests/runtime/data/test_util.h"

namespace cohort::runtime::data {
namespace {

using testing::freshTempDir;
using testing::messageOf;
using testing::writeFile;

std::string bigEndian(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// An IDX image file; pixel e of the file is (seed + 7e) mod 256.
std::string imagesFile(uint32_t count, uint32_t rows, uint32_t cols, int seed) {
  std::string s = bigEndian(kIdxImagesMagic) + bigEndian(count) + bigEndian(rows) + bigEndian(cols);
  for (uint32_t e = 0; e < count * rows * cols; ++e)
    s.push_back(static_cast<char>((seed + 7 * e) % 256));
  return s;
}

std::string labelsFile(const std::vector<uint8_t>& labels) {
  std::string s = bigEndian(kIdxLabelsMagic) + bigEndian(static_cast<uint32_t>(labels.size()));
  for (uint8_t l : labels) s.push_back(static_cast<char>(l));
  return s;
}

void writeGz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// A complete MNIST directory: 3 train and 2 test images of 2 x 3.
struct MnistDir {
  std::string dir = freshTempDir();
  std::vector<uint8_t> trainLabels{3, 9, 0};
  std::vector<uint8_t> testLabels{7, 1};

  explicit MnistDir(bool gzipped) {
    void (*write)(const std::string&, const std::string&) =
        gzipped ? +[](const std::string& p, const std::string& b) { writeGz(p + ".gz", b); }
                : +[](const std::string& p, const std::string& b) { writeFile(p, b); };
    write(dir + "/train-images-idx3-ubyte", imagesFile(3, 2, 3, 1));
    write(dir + "/train-labels-idx1-ubyte", labelsFile(trainLabels));
    write(dir + "/t10k-images-idx3-ubyte", imagesFile(2, 2, 3, 5));
    write(dir + "/t10k-labels-idx1-ubyte", labelsFile(testLabels));
  }
  std::string path(const std::string& name) const { return dir + "/" + name; }
};

void expectContents(const Dataset& d, int64_t n, int seed, const std::vector<uint8_t>& labels) {
  ASSERT_EQ(d.inputs().shape(), (Shape{n, 6}));
  ASSERT_EQ(d.targets().shape(), (Shape{n}));
  EXPECT_EQ(d.numClasses(), 10);
  for (int64_t e = 0; e < n * 6; ++e) {
    EXPECT_EQ(d.inputs().at(e), static_cast<float>((seed + 7 * e) % 256) / 255.0f) << e;
  }
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(d.targets().at(i), labels[static_cast<size_t>(i)]);
}

TEST(Mnist, ReadsPlainFiles) {
  MnistDir m(false);
  expectContents(*readMnist(m.dir, Split::kTrain), 3, 1, m.trainLabels);
  expectContents(*readMnist(m.dir + "/", Split::kTest), 2, 5, m.testLabels);
  expectContents(*openDataset("mnist:" + m.dir, Split::kTest), 2, 5, m.testLabels);
}

TEST(Mnist, ReadsGzippedFiles) {
  MnistDir m(true);
  expectContents(*readMnist(m.dir, Split::kTrain), 3, 1, m.trainLabels);
  expectContents(*readMnist(m.dir, Split::kTest), 2, 5, m.testLabels);
}

TEST(Mnist, PrefersThePlainFile) {
  MnistDir m(false);
  writeGz(m.path("train-labels-idx1-ubyte.gz"), labelsFile({1, 1, 1}));
  expectContents(*readMnist(m.dir, Split::kTrain), 3, 1, m.trainLabels);
}

TEST(Mnist, PixelsCoverTheUnitInterval) {
  std::string dir = freshTempDir();
  std::string images = bigEndian(kIdxImagesMagic) + bigEndian(1) + bigEndian(1) + bigEndian(2);
  images += std::string{'\0', '\xff'};
  writeFile(dir + "/train-images-idx3-ubyte", images);
  IdxImages read = readIdxImages(dir + "/train-images-idx3-ubyte");
  EXPECT_EQ(read.pixels, (std::vector<uint8_t>{0, 255}));
}

TEST(Mnist, BadMagic) {
  MnistDir m(false);
  std::string bad = imagesFile(3, 2, 3, 1);
  bad[3] = 0x01;
  writeFile(m.path("train-images-idx3-ubyte"), bad);
  std::string msg = messageOf<IoError>([&] { readMnist(m.dir, Split::kTrain); });
  EXPECT_NE(msg.find(m.path("train-images-idx3-ubyte")), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad magic number 0x801 (expected 0x803)"), std::string::npos) << msg;
}

TEST(Mnist, TruncatedPixelData) {
  MnistDir m(false);
  std::string file = imagesFile(3, 2, 3, 1);
  file.resize(file.size() - 4);
  writeFile(m.path("train-images-idx3-ubyte"), file);
  std::string msg = messageOf<IoError>([&] { readMnist(m.dir, Split::kTrain); });
  EXPECT_NE(msg.find(m.path("train-images-idx3-ubyte") +
                     ": truncated: expected 18 bytes of pixel data at offset 16, got 14"),
            std::string::npos)
      << msg;
}

TEST(Mnist, TruncatedGzippedLabels) {
  MnistDir m(true);
  std::string file = labelsFile({1, 2, 3});
  file.pop_back();
  writeGz(m.path("train-labels-idx1-ubyte.gz"), file);
  std::string msg = messageOf<IoError>([&] { readMnist(m.dir, Split::kTrain); });
  EXPECT_NE(msg.find(m.path("train-labels-idx1-ubyte.gz") +
                     ": truncated: expected 3 bytes of label data at offset 8, got 2"),
            std::string::npos)
      << msg;
}

TEST(Mnist, TruncatedHeader) {
  MnistDir m(false);
  writeFile(m.path("t10k-images-idx3-ubyte"), bigEndian(kIdxImagesMagic) + std::string(2, '\0'));
  std::string msg = messageOf<IoError>([&] { readMnist(m.dir, Split::kTest); });
  EXPECT_NE(msg.find(m.path("t10k-images-idx3-ubyte") + ": truncated"), std::string::npos) << msg;
}

TEST(Mnist, TrailingBytes) {
  MnistDir m(false);
  writeFile(m.path("train-images-idx3-ubyte"), imagesFile(3, 2, 3, 1) + "x");
  std::string msg = messageOf<IoError>([&] { readMnist(m.dir, Split::kTrain); });
  EXPECT_NE(msg.find(m.path("train-images-idx3-ubyte") + ": trailing data"), std::string::npos)
      << msg;

  MnistDir g(true);
  writeGz(g.path("t10k-labels-idx1-ubyte.gz"), labelsFile(g.testLabels) + "\x01");
  msg = messageOf<IoError>([&] { readMnist(g.dir, Split::kTest); });
  EXPECT_NE(msg.find(g.path("t10k-labels-idx1-ubyte.gz") + ": trailing data"), std::string::npos)
      << msg;
}

TEST(Mnist, CountMismatch) {
  MnistDir m(false);
  writeFile(m.path("train-labels-idx1-ubyte"), labelsFile({1, 2}));
  std::string msg = messageOf<IoError>([&] { readMnist(m.dir, Split::kTrain); });
  EXPECT_NE(msg.find(m.path("train-images-idx3-ubyte")), std::string::npos) << msg;
  EXPECT_NE(msg.find(m.path("train-labels-idx1-ubyte")), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 images but"), std::string::npos) << msg;
}

TEST(Mnist, LabelOutOfRange) {
  MnistDir m(false);
  writeFile(m.path("train-labels-idx1-ubyte"), labelsFile({1, 10, 2}));
  std::string msg = messageOf<IoError>([&] { readMnist(m.dir, Split::kTrain); });
  EXPECT_NE(msg.find(m.path("train-labels-idx1-ubyte") + ": label 10 at offset 9"),
            std::string::npos)
      << msg;
}

TEST(Mnist, ZeroDimension) {
  MnistDir m(false);
  writeFile(m.path("train-images-idx3-ubyte"), imagesFile(3, 0, 3, 1));
  std::string msg = messageOf<IoError>([&] { readMnist(m.dir, Split::kTrain); });
  EXPECT_NE(msg.find("zero rows"), std::string::npos) << msg;
}

TEST(Mnist, MissingFile) {
  std::string dir = freshTempDir();
  std::string msg = messageOf<IoError>([&] { readMnist(dir, Split::kTrain); });
  EXPECT_NE(msg.find(dir + "/train-images-idx3-ubyte"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir + "/train-images-idx3-ubyte.gz"), std::string::npos) << msg;

  MnistDir m(false);
  ASSERT_EQ(std::remove(m.path("t10k-labels-idx1-ubyte").c_str()), 0);
  msg = messageOf<IoError>([&] { readMnist(m.dir, Split::kTest); });
  EXPECT_NE(msg.find(m.path("t10k-labels-idx1-ubyte")), std::string::npos) << msg;
}

// Issue 33: what is at a file's name but is not a regular file was reported as missing ("no such
// file"), and a file given as DIR as a missing file inside it.
TEST(Mnist, RefusesWhatIsNotARegularFileAndAFileForTheDirectory) {
  MnistDir m(true);
  ASSERT_EQ(::mkdir(m.path("train-images-idx3-ubyte").c_str(), 0755), 0);  // beside the .gz
  std::string msg = messageOf<IoError>([&] { readMnist(m.dir, Split::kTrain); });
  EXPECT_EQ(msg, m.path("train-images-idx3-ubyte") + ": is a directory, not a regular file");
  EXPECT_EQ(readMnist(m.dir, Split::kTest)->size(), 2);  // the test split is unaffected

  msg = messageOf<IoError>([&] { openDataset("mnist:" + m.path("t10k-labels-idx1-ubyte.gz"), Split::kTrain); });
  EXPECT_EQ(msg, m.path("t10k-labels-idx1-ubyte.gz") +
                     ": is a regular file, not a directory; mnist:DIR names the directory that holds the IDX files");
}

}  // namespace
}  // namespace cohort::runtime::data
