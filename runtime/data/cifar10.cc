#include "runtime/data/cifar10.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "runtime/data/regular_file.h"
#include "runtime/error.h"

namespace cohort::runtime::data {
namespace {

constexpr int64_t kPlane = kCifar10Side * kCifar10Side;
constexpr int64_t kPixels = kCifar10Channels * kPlane;
constexpr int64_t kChunkRecords = 1000;  // records read per read() batch: about 3 MB
constexpr const char* kSubdir = "cifar-10-batches-bin";

std::string joinPath(const std::string& dir, const std::string& name) {
  return dir.empty() || dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool pathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// One opened batch file whose size has been checked. Owns the descriptor; move-only.
class RecordFile {
 public:
  explicit RecordFile(std::string path) : path_(std::move(path)), fd_(openRegularFile(path_)) {
    struct stat st;
    if (::fstat(fd_.get(), &st) != 0) COHORT_THROW(IoError) << path_ << ": cannot stat: " << std::strerror(errno);
    auto size = static_cast<int64_t>(st.st_size);
    if (size <= 0 || size % kCifar10RecordBytes != 0) {
      COHORT_THROW(IoError) << path_ << ": size " << size << " bytes is not a positive multiple of "
                            << kCifar10RecordBytes << " (one label byte and " << kPixels
                            << " pixel bytes per image)";
    }
    records_ = size / kCifar10RecordBytes;
  }
  RecordFile(RecordFile&&) noexcept = default;
  RecordFile(const RecordFile&) = delete;
  RecordFile& operator=(const RecordFile&) = delete;
  RecordFile& operator=(RecordFile&&) = delete;

  const std::string& path() const { return path_; }
  int64_t records() const { return records_; }

  // Reads exactly `bytes` bytes at the current position, or throws naming the offset.
  void readExactly(uint8_t* out, int64_t bytes) {
    int64_t got = 0;
    while (got < bytes) {
      ssize_t n = ::read(fd_.get(), out + got, static_cast<size_t>(bytes - got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        COHORT_THROW(IoError) << path_ << ": read error at offset " << offset_ + got << ": "
                              << std::strerror(errno);
      }
      if (n == 0) {
        COHORT_THROW(IoError) << path_ << ": truncated while reading: expected "
                              << records_ * kCifar10RecordBytes << " bytes, got " << offset_ + got;
      }
      got += n;
    }
    offset_ += got;
  }

 private:
  std::string path_;
  runtime::UniqueFd fd_;
  int64_t records_ = 0;
  int64_t offset_ = 0;
};

// Where the batch files are: DIR itself, or DIR/cifar-10-batches-bin when only it holds `first`.
std::string batchDir(const std::string& dir, const std::string& first) {
  std::string nested = joinPath(dir, kSubdir);
  if (!pathExists(joinPath(dir, first)) && pathExists(joinPath(nested, first))) return nested;
  return dir;
}

// The normalised value of every byte value, per channel: lut[c][p].
using Lut = std::array<std::array<float, 256>, kCifar10Channels>;

Lut normalisationTable() {
  Lut lut;
  for (size_t c = 0; c < lut.size(); ++c) {
    for (int p = 0; p < 256; ++p) {
      lut[c][static_cast<size_t>(p)] =
          (static_cast<float>(p) / 255.0f - kCifar10Mean[c]) / kCifar10Std[c];
    }
  }
  return lut;
}

// Reads all of `file` into inputs x and targets y (rows from the file's first record on).
void readRecords(RecordFile& file, const Lut& lut, float* x, float* y) {
  std::vector<uint8_t> chunk(static_cast<size_t>(kChunkRecords * kCifar10RecordBytes));
  for (int64_t first = 0; first < file.records(); first += kChunkRecords) {
    int64_t count = std::min(kChunkRecords, file.records() - first);
    file.readExactly(chunk.data(), count * kCifar10RecordBytes);
    for (int64_t r = 0; r < count; ++r) {
      const uint8_t* record = chunk.data() + r * kCifar10RecordBytes;
      if (record[0] >= kCifar10Classes) {
        COHORT_THROW(IoError) << file.path() << ": record " << first + r << " (offset "
                              << (first + r) * kCifar10RecordBytes << ") has label "
                              << int{record[0]} << ", not below " << kCifar10Classes;
      }
      y[first + r] = static_cast<float>(record[0]);
      float* out = x + (first + r) * kPixels;
      for (int64_t c = 0; c < kCifar10Channels; ++c) {
        const std::array<float, 256>& table = lut[static_cast<size_t>(c)];
        const uint8_t* plane = record + 1 + c * kPlane;
        for (int64_t e = 0; e < kPlane; ++e) out[c * kPlane + e] = table[plane[e]];
      }
    }
  }
}

}  // namespace

std::unique_ptr<Dataset> readCifar10(const std::string& dir, Split split) {
  requireDirectoryIfPresent(dir, "cifar10:DIR names the directory that holds the binary batches");
  std::vector<std::string> names;
  if (split == Split::kTrain) {
    for (int b = 1; b <= 5; ++b) names.push_back("data_batch_" + std::to_string(b) + ".bin");
  } else {
    names.push_back("test_batch.bin");
  }
  std::string where = batchDir(dir, names.front());
  // Open and size-check every file before allocating, so a bad last file fails fast.
  std::vector<RecordFile> files;
  int64_t total = 0;
  for (const std::string& name : names) {
    std::string path = joinPath(where, name);
    if (files.empty() && !pathExists(path)) {
      COHORT_THROW(IoError) << path << ": no such file (nor "
                            << joinPath(joinPath(dir, kSubdir), name)
                            << "); cifar10:DIR wants the binary batches (data_batch_1.bin .. "
                               "data_batch_5.bin, test_batch.bin)";
    }
    files.emplace_back(path);
    total += files.back().records();
  }
  DatasetContents c;
  c.name = "cifar10:" + dir + (split == Split::kTrain ? "/train" : "/test");
  c.inputs =
      Tensor::empty(Shape{total, kCifar10Channels, kCifar10Side, kCifar10Side}, cpuAllocator());
  c.targets = Tensor::empty(Shape{total}, cpuAllocator());
  c.numClasses = kCifar10Classes;
  const Lut lut = normalisationTable();
  int64_t row = 0;
  for (RecordFile& file : files) {
    readRecords(file, lut, c.inputs.data() + row * kPixels, c.targets.data() + row);
    row += file.records();
  }
  return std::make_unique<Dataset>(std::move(c));
}

}  // namespace cohort::runtime::data
