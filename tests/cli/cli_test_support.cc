#include "tests/cli/cli_test_support.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "nn/checkpoint.h"
#include "nn/model_weights.h"

namespace cohort::testing {

std::string cohortBinary() { return runfile("cli/cohort"); }

CommandResult runCohort(const std::vector<std::string>& args, const CommandOptions& options) {
  std::vector<std::string> argv = {cohortBinary()};
  argv.insert(argv.end(), args.begin(), args.end());
  return runCommand(argv, options);
}

void writeFile(const std::string& path, const std::string& bytes, Compression compression) {
  if (compression == Compression::kGzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    if (!f) {
      ADD_FAILURE() << "gzopen " << path << ": " << std::strerror(errno);
      return;
    }
    int wrote = bytes.empty() ? 0 : gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    if (gzclose(f) != Z_OK || wrote != static_cast<int>(bytes.size())) ADD_FAILURE() << "gzwrite " << path;
    return;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) ADD_FAILURE() << "cannot write " << path;
}

std::string writeLargestOfThreeCsv(const std::string& path) {
  std::string text = "a,b,c,label\n";
  for (int i = 0; i < 240; ++i) {
    const int a = (i * 7) % 10, b = (i * 3 + 1) % 10, c = (i * 11 + 5) % 10;
    text += std::to_string(a) + "," + std::to_string(b) + "," + std::to_string(c) + "," +
            std::to_string(a >= b && a >= c ? 0 : (b >= c ? 1 : 2)) + "\n";
  }
  writeFile(path, text);
  return "csv:" + path;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot read " << path;
    return {};
  }
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

bool fileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<std::string> listDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    ADD_FAILURE() << "opendir " << dir << ": " << std::strerror(errno);
    return names;
  }
  // This user's private shared-memory directory (ipc/private_dir.h) stays, empty, after every job:
  // what counts is what is in it.
  const std::string privateDir = "cohort-" + std::to_string(::geteuid());
  while (const dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    if (e->d_name == privateDir) {
      for (const std::string& inner : listDir(dir + "/" + privateDir)) names.push_back(privateDir + "/" + inner);
      continue;
    }
    names.push_back(e->d_name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

namespace {
void appendBigEndian32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
}
}  // namespace

std::string idxImagesBytes(uint32_t count, uint32_t rows, uint32_t cols, const std::vector<uint8_t>& pixels,
                           uint32_t magic) {
  std::string out;
  appendBigEndian32(out, magic);
  appendBigEndian32(out, count);
  appendBigEndian32(out, rows);
  appendBigEndian32(out, cols);
  out.append(pixels.begin(), pixels.end());
  return out;
}

std::string idxLabelsBytes(const std::vector<uint8_t>& labels, uint32_t magic) {
  std::string out;
  appendBigEndian32(out, magic);
  appendBigEndian32(out, static_cast<uint32_t>(labels.size()));
  out.append(labels.begin(), labels.end());
  return out;
}

TinyMnist makeTinyMnist(uint32_t count, uint32_t offset) {
  constexpr int kSide = 28;
  TinyMnist set;
  set.pixels.resize(size_t{count} * kSide * kSide);
  for (uint32_t i = 0; i < count; ++i) {
    const int label = static_cast<int>((i * 7 + offset) % 10);
    set.labels.push_back(static_cast<uint8_t>(label));
    uint8_t* image = set.pixels.data() + size_t{i} * kSide * kSide;
    for (int r = 0; r < kSide; ++r) {
      for (int c = 0; c < kSide; ++c) {
        const bool band = r / 2 == label;
        image[r * kSide + c] = band ? 255 : static_cast<uint8_t>((r * 31 + c * 17 + i) % 40);
      }
    }
  }
  return set;
}

void writeTinyMnistDir(const std::string& dir, uint32_t trainCount, uint32_t testCount, Compression compression) {
  const bool gzip = compression == Compression::kGzip;
  const std::string suffix = gzip ? ".gz" : "";
  TinyMnist train = makeTinyMnist(trainCount, 0), test = makeTinyMnist(testCount, 3);
  writeFile(dir + "/train-images-idx3-ubyte" + suffix, idxImagesBytes(trainCount, 28, 28, train.pixels), compression);
  writeFile(dir + "/train-labels-idx1-ubyte" + suffix, idxLabelsBytes(train.labels), compression);
  writeFile(dir + "/t10k-images-idx3-ubyte" + suffix, idxImagesBytes(testCount, 28, 28, test.pixels), compression);
  writeFile(dir + "/t10k-labels-idx1-ubyte" + suffix, idxLabelsBytes(test.labels), compression);
}

double ResultLine::number(const std::string& key) const {
  auto it = fields.find(key);
  if (it == fields.end()) {
    ADD_FAILURE() << "RESULT line has no " << key;
    return std::nan("");
  }
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0') {
    ADD_FAILURE() << "RESULT " << key << "=" << it->second << " is not a number";
    return std::nan("");
  }
  return v;
}

ResultLine parseResultLine(const std::string& stdoutText) {
  ResultLine result;
  std::istringstream lines(stdoutText);
  for (std::string line; std::getline(lines, line);) {
    // Under cohortrun the line carries the launcher's "[rank 0] " prefix.
    if (line.rfind("[rank ", 0) == 0 && line.find("] ") != std::string::npos) line = line.substr(line.find("] ") + 2);
    if (line.rfind("RESULT ", 0) != 0) continue;
    ++result.count;
    result.fields.clear();
    std::istringstream words(line.substr(7));
    for (std::string word; words >> word;) {
      size_t eq = word.find('=');
      if (eq != std::string::npos) result.fields[word.substr(0, eq)] = word.substr(eq + 1);
    }
  }
  return result;
}

int countLines(const std::string& text) {
  int n = static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  if (!text.empty() && text.back() != '\n') ++n;
  return n;
}

double jsonNumber(const std::string& line, const std::string& key) {
  size_t at = line.find("\"" + key + "\":");
  if (at == std::string::npos) return std::nan("");
  return std::strtod(line.c_str() + at + key.size() + 3, nullptr);
}

int expectSameParameters(const std::string& reference, const std::string& actual, double tolerance,
                         const std::string& context) {
  // A ZeRO job's checkpoint is sharded: read as one model (its parameters by name), as eval reads it.
  nn::Checkpoint ref = nn::readCheckpoint(reference), other;
  other.tensors = nn::readModelWeights(actual).tensors;
  int compared = 0;
  for (const auto& t : ref.tensors) {
    if (t.name.rfind("optimizer.", 0) == 0) continue;
    const runtime::Tensor* o = other.find(t.name);
    if (o == nullptr || o->numel() != t.tensor.numel()) {
      ADD_FAILURE() << actual << ": no tensor " << t.name << " of " << t.tensor.numel() << " elements " << context;
      continue;
    }
    double worst = 0;
    for (int64_t i = 0; i < t.tensor.numel(); ++i) worst = std::max(worst, std::fabs(double(o->at(i)) - t.tensor.at(i)));
    EXPECT_LE(worst, tolerance) << t.name << " differs by " << worst << " " << context;
    ++compared;
  }
  return compared;
}

void expectIdenticalCheckpoints(const std::string& reference, const std::string& actual, const std::string& context) {
  nn::Checkpoint a = nn::readCheckpoint(reference), c = nn::readCheckpoint(actual);
  EXPECT_EQ(c.metadata["step"], a.metadata["step"]) << context;
  ASSERT_EQ(a.tensors.size(), c.tensors.size()) << context;
  for (const auto& t : a.tensors) {
    const runtime::Tensor* other = c.find(t.name);
    ASSERT_NE(other, nullptr) << context << ": " << t.name;
    ASSERT_EQ(other->numel(), t.tensor.numel()) << context << ": " << t.name;
    int64_t differing = 0;
    for (int64_t i = 0; i < t.tensor.numel(); ++i) differing += other->at(i) != t.tensor.at(i);
    EXPECT_EQ(differing, 0) << context << ": " << t.name << " differs in " << differing << " elements";
  }
}

}  // namespace cohort::testing
