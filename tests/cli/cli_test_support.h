// Shared pieces of the end-to-end tests that run the real `cohort` binary (//cli:cohort, a data
// dependency of every test here): where the binary is, a fresh directory per test, small file
// helpers (plain and gzip), IDX (MNIST) file bytes, and parsing of the RESULT line (README.md).
// All functions report problems with gtest failures rather than exceptions, so a broken fixture
// fails the test that uses it. Thread safety: none needed (one test runs at a time per process).
//
//   std::string dir = freshTempDir();
//   CommandResult r = runCohort({"train", "--data", "csv:" + dir + "/x.csv", "--model", "mlp:3,1"});
//   ResultLine result = parseResultLine(r.stdoutText);
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "tests/support/process.h"

namespace cohort::testing {

// Absolute path of the cohort binary in this test's runfiles.
std::string cohortBinary();

// Runs `cohort ARGS...` (the binary is prepended).
CommandResult runCohort(const std::vector<std::string>& args, const CommandOptions& options = {});


enum class Compression { kPlain, kGzip };

// Writes `bytes` to `path` (replacing it), gzip-compressed for kGzip.
void writeFile(const std::string& path, const std::string& bytes, Compression compression = Compression::kPlain);
std::string readFile(const std::string& path);
// Writes at `path` a 3-class CSV of 240 rows (features a, b, c from 0 to 9; the class is the
// largest's) and returns its data spec, "csv:PATH".
std::string writeLargestOfThreeCsv(const std::string& path);
bool fileExists(const std::string& path);
// The names in `dir` (including dot files, excluding "." and ".."), sorted. The private
// shared-memory directory cohort-<euid> (ipc/private_dir.h) is listed by its contents
// ("cohort-0/cohort.<job>.roster"), so that a shared-memory directory counts as empty when only
// that directory, empty, is left.
std::vector<std::string> listDir(const std::string& dir);

// The bytes of IDX files as runtime/data/mnist.h reads them (big-endian header).
std::string idxImagesBytes(uint32_t count, uint32_t rows, uint32_t cols, const std::vector<uint8_t>& pixels,
                           uint32_t magic = 0x00000803);
std::string idxLabelsBytes(const std::vector<uint8_t>& labels, uint32_t magic = 0x00000801);

// A tiny learnable MNIST-like set: image i shows a bright horizontal band at rows 2*label..2*label+1
// of a dim 28x28 background, label = (i * 7 + offset) % 10.
struct TinyMnist {
  std::vector<uint8_t> pixels;  // count * 28 * 28
  std::vector<uint8_t> labels;
};
TinyMnist makeTinyMnist(uint32_t count, uint32_t offset);
// Writes the four IDX files of a tiny MNIST directory (train/t10k) into `dir`, plain or .gz.
void writeTinyMnistDir(const std::string& dir, uint32_t trainCount, uint32_t testCount, Compression compression);

// The key=value fields of the one line of `stdoutText` that starts with "RESULT " (or "[rank k] RESULT ",
// as cohortrun prints it).
struct ResultLine {
  int count = 0;  // how many RESULT lines there were (only the last is parsed)
  std::map<std::string, std::string> fields;

  bool has(const std::string& key) const { return fields.count(key) != 0; }
  // The field as a number; fails the test (and returns NaN) when absent or not a number.
  double number(const std::string& key) const;
};
ResultLine parseResultLine(const std::string& stdoutText);

// Number of '\n'-terminated lines in `text`; an unterminated last line counts too.
int countLines(const std::string& text);
// The parameters (every tensor but "optimizer.*") of the checkpoint at `reference` against those at
// `actual`: each within `tolerance` (the largest absolute difference), else a test failure naming the
// tensor, the difference and `context`. Returns how many tensors were compared.
int expectSameParameters(const std::string& reference, const std::string& actual, double tolerance,
                         const std::string& context = "");

// Every tensor of the checkpoint at `actual` (parameters and optimizer state) bit for bit equal to
// the one of that name at `reference`, and the same step: else a test failure naming the tensor,
// how many elements differ, and `context`.
void expectIdenticalCheckpoints(const std::string& reference, const std::string& actual, const std::string& context = "");

// The number after "key": in a JSON line (a metrics line), or NaN when the key is absent.
double jsonNumber(const std::string& line, const std::string& key);

// A test with its own directory (dir_) and, inside it, its own shared-memory directory (shm_), set as
// COHORT_SHM_DIR for every program it starts, so "nothing left in shared memory" can be checked.
class ShmDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = freshTempDir();
    shm_ = dir_ + "/shm";
    ASSERT_EQ(::mkdir(shm_.c_str(), 0700), 0);
    setenv("COHORT_SHM_DIR", shm_.c_str(), 1);
  }
  std::string dir_, shm_;
};

}  // namespace cohort::testing
