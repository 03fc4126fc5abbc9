#include "runtime/data/cifar10.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

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

constexpr int64_t kPixels = 3 * 32 * 32;
constexpr int64_t kRecord = 1 + kPixels;

// The published CIFAR-10 channel statistics, written out here rather than taken from the header.
constexpr double kMean[3] = {0.4914, 0.4822, 0.4465};
constexpr double kStd[3] = {0.2470, 0.2435, 0.2616};

// Pixel byte e (0 .. 3071, in file order) of a record made with `seed`.
uint8_t pixel(int seed, int64_t e) { return static_cast<uint8_t>((seed + 7 * e) % 256); }

std::string record(int label, int seed) {
  std::string s(1, static_cast<char>(label));
  for (int64_t e = 0; e < kPixels; ++e) s.push_back(static_cast<char>(pixel(seed, e)));
  return s;
}

double normalised(int p, int64_t channel) { return (p / 255.0 - kMean[channel]) / kStd[channel]; }

// Train records j = 0 .. 8 spread over the five batch files as 2, 1, 3, 1, 2 records, with label
// (3j + 1) mod 10 and pixel seed 13j + 5; two test records with labels 9, 0 and seeds 200, 201.
struct CifarDir {
  std::string root = freshTempDir();
  std::string dir;
  std::vector<int> perFile{2, 1, 3, 1, 2};

  explicit CifarDir(const std::string& subdir = "") {
    dir = subdir.empty() ? root : root + "/" + subdir;
    if (!subdir.empty()) ::mkdir(dir.c_str(), 0755);
    int j = 0;
    for (int b = 1; b <= 5; ++b) {
      std::string bytes;
      for (int r = 0; r < perFile[static_cast<size_t>(b - 1)]; ++r, ++j)
        bytes += record(trainLabel(j), trainSeed(j));
      writeFile(path("data_batch_" + std::to_string(b) + ".bin"), bytes);
    }
    writeFile(path("test_batch.bin"), record(9, 200) + record(0, 201));
  }
  static int trainLabel(int j) { return (3 * j + 1) % 10; }
  static int trainSeed(int j) { return 13 * j + 5; }
  std::string path(const std::string& name) const { return dir + "/" + name; }
};

// Element (i, c, y, x) of the dataset is pixel byte 1024 c + 32 y + x of record i.
void expectContents(const Dataset& d, const std::vector<int>& labels,
                    const std::vector<int>& seeds) {
  auto n = static_cast<int64_t>(labels.size());
  ASSERT_EQ(d.inputs().shape(), (Shape{n, 3, 32, 32}));
  ASSERT_EQ(d.targets().shape(), (Shape{n}));
  EXPECT_EQ(d.sampleShape(), (Shape{3, 32, 32}));
  EXPECT_EQ(d.numClasses(), 10);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(d.targets().at(i), static_cast<float>(labels[static_cast<size_t>(i)])) << i;
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t yx = 0; yx < 1024; ++yx) {
        int p = pixel(seeds[static_cast<size_t>(i)], 1024 * c + yx);
        ASSERT_NEAR(d.inputs().at(i * kPixels + 1024 * c + yx), normalised(p, c), 1e-5)
            << "sample " << i << " channel " << c << " pixel " << yx;
      }
    }
  }
}

TEST(Cifar10, ReadsTheFiveTrainBatchesInOrder) {
  CifarDir cifar;
  std::vector<int> labels, seeds;
  for (int j = 0; j < 9; ++j) {
    labels.push_back(CifarDir::trainLabel(j));
    seeds.push_back(CifarDir::trainSeed(j));
  }
  auto train = readCifar10(cifar.dir, Split::kTrain);
  EXPECT_EQ(train->name(), "cifar10:" + cifar.dir + "/train");
  expectContents(*train, labels, seeds);
  expectContents(*openDataset("cifar10:" + cifar.dir, Split::kTrain), labels, seeds);
}

TEST(Cifar10, ReadsTheTestBatch) {
  CifarDir cifar;
  expectContents(*readCifar10(cifar.dir + "/", Split::kTest), {9, 0}, {200, 201});
  expectContents(*openDataset("cifar10:" + cifar.dir, Split::kTest), {9, 0}, {200, 201});
}

TEST(Cifar10, FindsTheTarballsSubdirectory) {
  CifarDir cifar("cifar-10-batches-bin");
  expectContents(*readCifar10(cifar.root, Split::kTest), {9, 0}, {200, 201});
}

TEST(Cifar10, NormalisesEachChannelWithTheStandardStatistics) {
  EXPECT_EQ(kCifar10Mean, (std::array<float, 3>{0.4914f, 0.4822f, 0.4465f}));
  EXPECT_EQ(kCifar10Std, (std::array<float, 3>{0.2470f, 0.2435f, 0.2616f}));
  // Red all 0, green all 255, blue all 128.
  std::string r(1, '\x07');
  r += std::string(1024, '\0') + std::string(1024, '\xff') + std::string(1024, '\x80');
  std::string dir = freshTempDir();
  writeFile(dir + "/test_batch.bin", r);
  auto d = readCifar10(dir, Split::kTest);
  EXPECT_EQ(d->targets().at(0), 7.0f);
  double expected[3] = {-0.4914 / 0.2470, (1 - 0.4822) / 0.2435, (128 / 255.0 - 0.4465) / 0.2616};
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t yx : {0, 1, 517, 1023})
      EXPECT_NEAR(d->inputs().at(1024 * c + yx), expected[c], 1e-5) << c;
  }
}

TEST(Cifar10, RefusesASizeThatIsNotAMultipleOfTheRecord) {
  CifarDir cifar;
  std::string file = cifar.path("data_batch_2.bin");
  writeFile(file, record(1, 1) + record(2, 2) + "12345");
  std::string msg = messageOf<IoError>([&] { readCifar10(cifar.dir, Split::kTrain); });
  EXPECT_NE(msg.find(file + ": size 6151 bytes is not a positive multiple of 3073"),
            std::string::npos)
      << msg;

  writeFile(cifar.path("test_batch.bin"), "");
  msg = messageOf<IoError>([&] { readCifar10(cifar.dir, Split::kTest); });
  EXPECT_NE(msg.find(cifar.path("test_batch.bin") + ": size 0 bytes"), std::string::npos) << msg;
}

TEST(Cifar10, RefusesALabelOfTenOrMore) {
  CifarDir cifar;
  std::string file = cifar.path("data_batch_4.bin");
  writeFile(file, record(3, 1) + record(10, 2) + record(255, 3));
  std::string msg = messageOf<IoError>([&] { readCifar10(cifar.dir, Split::kTrain); });
  EXPECT_NE(msg.find(file + ": record 1 (offset 3073) has label 10, not below 10"),
            std::string::npos)
      << msg;
}

TEST(Cifar10, MissingFiles) {
  std::string empty = freshTempDir();
  std::string msg = messageOf<IoError>([&] { readCifar10(empty, Split::kTrain); });
  EXPECT_NE(msg.find(empty + "/data_batch_1.bin: no such file"), std::string::npos) << msg;
  EXPECT_NE(msg.find(empty + "/cifar-10-batches-bin/data_batch_1.bin"), std::string::npos) << msg;
  msg = messageOf<IoError>([&] { openDataset("cifar10:" + empty, Split::kTest); });
  EXPECT_NE(msg.find(empty + "/test_batch.bin: no such file"), std::string::npos) << msg;

  CifarDir cifar;
  ASSERT_EQ(std::remove(cifar.path("data_batch_3.bin").c_str()), 0);
  msg = messageOf<IoError>([&] { readCifar10(cifar.dir, Split::kTrain); });
  EXPECT_NE(msg.find(cifar.path("data_batch_3.bin") + ": no such file"), std::string::npos) << msg;
  EXPECT_EQ(readCifar10(cifar.dir, Split::kTest)->size(), 2);  // the test split is unaffected
}

TEST(Cifar10, RefusesADirectoryInPlaceOfAFile) {
  CifarDir cifar;
  ASSERT_EQ(std::remove(cifar.path("test_batch.bin").c_str()), 0);
  ASSERT_EQ(::mkdir(cifar.path("test_batch.bin").c_str(), 0755), 0);
  std::string msg = messageOf<IoError>([&] { readCifar10(cifar.dir, Split::kTest); });
  EXPECT_EQ(msg, cifar.path("test_batch.bin") + ": is a directory, not a regular file");
}

TEST(Cifar10, RefusesAFileForTheDirectory) {
  CifarDir cifar;
  std::string msg = messageOf<IoError>([&] { openDataset("cifar10:" + cifar.path("test_batch.bin"), Split::kTest); });
  EXPECT_EQ(msg, cifar.path("test_batch.bin") +
                     ": is a regular file, not a directory; cifar10:DIR names the directory that holds the binary "
                     "batches");
}

TEST(Cifar10, SpecNeedsADirectory) {
  std::string msg = messageOf<InvalidArgument>([] { openDataset("cifar10:", Split::kTrain); });
  EXPECT_NE(msg.find("needs a path"), std::string::npos) << msg;
}

}  // namespace
}  // namespace cohort::runtime::data
