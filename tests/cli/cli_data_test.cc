// `cohort train` on files: CSV regression and classification, a huge --prefetch on a tiny CSV, a CSV
// error that quotes the file's bytes, and MNIST IDX directories (plain and gzipped), all written by
// the test into its own directory.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"

namespace cohort::testing {
namespace {

// The value after the last " KEY " in the progress lines (e.g. "train_acc 0.98"), or NaN.
double lastLoggedValue(const std::string& stdoutText, const std::string& key) {
  size_t at = stdoutText.rfind(" " + key + " ");
  if (at == std::string::npos) return std::nan("");
  return std::strtod(stdoutText.c_str() + at + key.size() + 2, nullptr);
}

// Features a, b, c on a grid of multiples of 1/4 in [-1, 0.75] (8 values each, 512 rows), so every
// value and every target is exact in decimal and in float32.
struct GridRow {
  double a, b, c;
};
std::vector<GridRow> grid() {
  std::vector<GridRow> rows;
  for (int i = 0; i < 512; ++i) rows.push_back({(i % 8) * 0.25 - 1, ((i / 8) % 8) * 0.25 - 1, (i / 64) * 0.25 - 1});
  return rows;
}

TEST(CliDataTest, CsvRegressionConverges) {
  const std::string dir = freshTempDir();
  std::ostringstream csv;
  csv << "a,b,c,target\n";
  std::vector<double> targets;
  for (const GridRow& r : grid()) {
    targets.push_back(0.5 * r.a - 2 * r.b + r.c + 1);
    csv << r.a << "," << r.b << "," << r.c << "," << targets.back() << "\n";
  }
  writeFile(dir + "/linear.csv", csv.str());
  double mean = 0, variance = 0;
  for (double t : targets) mean += t / static_cast<double>(targets.size());
  for (double t : targets) variance += (t - mean) * (t - mean) / static_cast<double>(targets.size());
  ASSERT_GT(variance, 1.0);  // 5.25 * 21/64 = 1.72

  // Adam at lr 0.01 reaches ~1e-3 by epoch 20 and 2e-4..8e-4 by epoch 40 for seeds 0..5: the bound
  // below (1.7e-2) leaves a margin of 20x.
  CommandResult r = runCohort({"train", "--data", "csv:" + dir + "/linear.csv", "--loss", "mse", "--optimizer", "adam",
                               "--lr", "0.01", "--model", "mlp:3,16,1", "--epochs", "40", "--batch-size", "32",
                               "--threads", "1", "--seed", "0"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.stderrText, "");
  ResultLine result = parseResultLine(r.stdoutText);
  ASSERT_EQ(result.count, 1) << r.describe();
  EXPECT_EQ(result.fields["epochs"], "40");
  EXPECT_LT(result.number("train_loss"), 0.01 * variance) << r.describe();
  EXPECT_FALSE(result.has("test_acc")) << "regression has no accuracy\n" << r.describe();
  EXPECT_FALSE(result.has("test_loss")) << "a CSV has no test split unless --test-data is given\n" << r.describe();
  EXPECT_EQ(r.stdoutText.find("train_acc"), std::string::npos) << r.describe();
}

TEST(CliDataTest, CsvClassificationReportsAccuracy) {
  const std::string dir = freshTempDir();
  // Three classes, linearly separable: (a > b) + (c > 0).
  std::ostringstream csv;
  csv << "a,b,c,label\n";
  for (const GridRow& r : grid()) csv << r.a << "," << r.b << "," << r.c << "," << (r.a > r.b) + (r.c > 0) << "\n";
  writeFile(dir + "/classes.csv", csv.str());
  const std::string data = "csv:" + dir + "/classes.csv";
  CommandResult r = runCohort(
      {"train",       "--data",       data,   "--test-data", data,      "--loss",     "ce",
       "--optimizer", "adam",         "--lr", "0.01",        "--model", "mlp:3,16,3", "--epochs",
       "40",          "--batch-size", "32",   "--threads",   "1",       "--metrics",  dir + "/metrics.jsonl"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  ResultLine result = parseResultLine(r.stdoutText);
  ASSERT_EQ(result.count, 1) << r.describe();
  EXPECT_GE(result.number("test_acc"), 0.95) << r.describe();  // 1.0 here
  EXPECT_GE(lastLoggedValue(r.stdoutText, "train_acc"), 0.95) << r.describe();
  const std::string metrics = readFile(dir + "/metrics.jsonl");
  EXPECT_EQ(countLines(metrics), 40);
  EXPECT_NE(metrics.find("\"train_acc\""), std::string::npos) << metrics;
}

TEST(CliDataTest, CsvWithoutTestDataHasNoTestAccuracy) {
  const std::string dir = freshTempDir();
  writeFile(dir + "/small.csv", "1,2,0\n3,4,1\n5,6,1\n7,8,0\n");  // no header: line 1 is numeric
  CommandResult r = runCohort({"train", "--data", "csv:" + dir + "/small.csv", "--model", "mlp:2,2", "--epochs", "2",
                               "--batch-size", "2", "--threads", "1"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  ResultLine result = parseResultLine(r.stdoutText);
  EXPECT_EQ(result.fields["epochs"], "2");
  EXPECT_FALSE(result.has("test_acc"));
  EXPECT_NE(r.stdoutText.find("4 samples"), std::string::npos) << r.describe();
}

// The peak resident size in bytes from "memory report (cpu): peak resident 16.1 MiB; ..." (the
// units of runtime::formatBytes), or NaN when the line is missing.
double peakResidentBytes(const std::string& stdoutText) {
  const std::string key = "memory report (cpu): peak resident ";
  size_t at = stdoutText.find(key);
  if (at == std::string::npos) return std::nan("");
  std::istringstream in(stdoutText.substr(at + key.size()));
  double value = 0;
  std::string unit;
  in >> value >> unit;
  if (!unit.empty() && unit.back() == ';') unit.pop_back();
  const std::vector<std::string> units = {"B", "KiB", "MiB", "GiB", "TiB"};
  for (size_t u = 0; u < units.size(); ++u) {
    if (unit == units[u]) return std::ldexp(value, static_cast<int>(10 * u));
  }
  return std::nan("");
}

// Issue 15: the loader allocated a slot for every batch asked for, so `--prefetch 100000000` on a
// 23-batch set grew to 3.2 GB in 4 s. The depth is now capped at the epoch's batches and a memory
// budget (runtime/data/data_loader.h); a run like this one peaks at about 16 MB. It runs under
// `ulimit -v` (4 GiB of address space) so that a regression fails here with an allocation error
// rather than by taking the memory of the machine the tests run on.
TEST(CliDataTest, HugePrefetchIsCappedByTheLoader) {
  const std::string dir = freshTempDir();
  std::ostringstream csv;
  for (int i = 0; i < 23; ++i) csv << i % 3 << "," << i % 5 << "," << i % 2 << "\n";
  writeFile(dir + "/tiny.csv", csv.str());
  CommandOptions options;
  options.timeout = std::chrono::seconds(60);  // "quickly": it takes about 0.1 s
  CommandResult r = runCommand({"/bin/sh", "-c", "ulimit -v 4194304 && exec \"$0\" \"$@\"", cohortBinary(), "train",
                                "--data", "csv:" + dir + "/tiny.csv", "--model", "mlp:2,2", "--epochs", "2",
                                "--batch-size", "1", "--threads", "1", "--prefetch", "100000000", "--memory-report"},
                               options);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(parseResultLine(r.stdoutText).count, 1) << r.describe();
  const double peak = peakResidentBytes(r.stdoutText);
  ASSERT_FALSE(std::isnan(peak)) << "no CPU memory report\n" << r.describe();
  EXPECT_LT(peak, 100e6) << r.describe();
}

// Issue 15: a CSV's bytes were echoed raw in the error, so invalid UTF-8 and terminal escapes from
// the file reached the user's terminal. They arrive escaped; valid UTF-8 (the é) stays readable.
TEST(CliDataTest, CsvErrorEscapesTheFilesBytes) {
  const std::string dir = freshTempDir();
  writeFile(dir + "/bad.csv", "x,y\n1,2\n3,\xff\xfe\x1b[31m\xc3\xa9\n");
  CommandResult r = runCohort({"train", "--data", "csv:" + dir + "/bad.csv", "--model", "mlp:1,2", "--epochs", "1",
                               "--batch-size", "2", "--threads", "1"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_NE(r.stderrText.find(std::string(R"(bad.csv:3: column 2: '\xff\xfe\x1b[31m)") + "\xc3\xa9' is not a number"),
            std::string::npos)
      << r.describe();
  std::string rest = r.stderrText;  // without the é, no byte may be >= 0x80 or a control but '\n'
  for (size_t at; (at = rest.find("\xc3\xa9")) != std::string::npos;) rest.erase(at, 2);
  for (unsigned char c : rest) {
    EXPECT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f)) << "raw byte " << static_cast<int>(c) << " in stderr";
  }
}

ResultLine trainOnTinyMnist(Compression compression) {
  const std::string dir = freshTempDir() + (compression == Compression::kGzip ? "/gz" : "/plain");
  EXPECT_EQ(::mkdir(dir.c_str(), 0755), 0);
  writeTinyMnistDir(dir, 64, 32, compression);
  CommandResult r = runCohort({"train", "--data", "mnist:" + dir, "--model", "mlp:784,32,10", "--epochs", "1",
                               "--batch-size", "16", "--threads", "1", "--seed", "7"});
  EXPECT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(r.stderrText, "");
  EXPECT_NE(r.stdoutText.find("64 samples per epoch, test 32"), std::string::npos) << r.describe();
  ResultLine result = parseResultLine(r.stdoutText);
  EXPECT_EQ(result.count, 1) << r.describe();
  EXPECT_TRUE(result.has("test_acc")) << r.describe();
  if (result.has("test_acc")) {
    EXPECT_GE(result.number("test_acc"), 0.0);
    EXPECT_LE(result.number("test_acc"), 1.0);
  }
  return result;
}

TEST(CliDataTest, MnistPlainAndGzippedGiveTheSameRun) {
  ResultLine plain = trainOnTinyMnist(Compression::kPlain);
  ResultLine gz = trainOnTinyMnist(Compression::kGzip);
  // Same pixels, same seed: the training is bit for bit the same.
  for (const char* key : {"epochs", "train_loss", "test_loss", "test_acc"}) {
    EXPECT_EQ(plain.fields[key], gz.fields[key]) << key;
  }
}

// Issue 33: `--data text:DIR` exited 1 with "basic_filebuf::underflow error reading the file",
// `csv:DIR` called the directory an empty file, text:/dev/zero was read until memory ran out, and a
// FIFO in place of a CIFAR-10 batch blocked the run forever. Every file-based spec now takes regular
// files only: exit 2 and one line naming the path and what it is. (/dev/null stands for /dev/zero:
// the same refusal, and a run of the old code on it ends instead of filling memory.)
TEST(CliDataTest, DataThatIsNotARegularFileIsRefusedNamingIt) {
  const std::string dir = freshTempDir();
  ASSERT_EQ(::mkfifo((dir + "/fifo.csv").c_str(), 0600), 0);
  ASSERT_EQ(::mkdir((dir + "/cifar").c_str(), 0755), 0);
  ASSERT_EQ(::mkfifo((dir + "/cifar/data_batch_1.bin").c_str(), 0600), 0);
  const std::string gpt = "gpt:layers=1,heads=1,dim=8,ctx=8";
  struct Case {
    std::string data, model, message;
  };
  const Case cases[] = {
      {"text:" + dir, gpt, dir + ": is a directory, not a regular file"},
      {"csv:" + dir, "mlp:1,2", dir + ": is a directory, not a regular file"},
      {"text:/dev/null", gpt, "/dev/null: is a character device, not a regular file"},
      {"csv:" + dir + "/fifo.csv", "mlp:1,2", dir + "/fifo.csv: is a FIFO or pipe, not a regular file"},
      {"cifar10:" + dir + "/cifar", "mlp:3072,10",
       dir + "/cifar/data_batch_1.bin: is a FIFO or pipe, not a regular file"},
  };
  for (const Case& c : cases) {
    CommandResult r = runCohort({"train", "--data", c.data, "--model", c.model, "--epochs", "1", "--threads", "1"},
                                {.timeout = std::chrono::seconds(15)});
    EXPECT_EQ(r.exitCode, 2) << r.describe();
    EXPECT_EQ(r.stderrText, "[rank 0] cohort: error: " + c.message + "\n") << r.describe();
  }
}

}  // namespace
}  // namespace cohort::testing
