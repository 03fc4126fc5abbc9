#include "runtime/data/mnist.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/data/regular_file.h"
#include "runtime/error.h"

namespace cohort::runtime::data {
namespace {

constexpr int64_t kMnistClasses = 10;
constexpr int64_t kHeaderWordBytes = 4;
// Upper bound on one file's payload; a header announcing more is corrupt, not a real dataset.
constexpr int64_t kMaxPayloadBytes = int64_t{1} << 36;

bool pathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// RAII over a gzFile. Reads plain and gzip files alike; `name` is the path actually opened: the
// plain file when anything by its name exists (refused unless a regular file), else the .gz one.
class GzReader {
 public:
  explicit GzReader(const std::string& plainPath) {
    if (pathExists(plainPath)) {
      name_ = plainPath;
    } else if (pathExists(plainPath + ".gz")) {
      name_ = plainPath + ".gz";
    } else {
      COHORT_THROW(IoError) << plainPath << ": no such file (nor " << plainPath << ".gz)";
    }
    runtime::UniqueFd fd = openRegularFile(name_);
    file_ = gzdopen(fd.get(), "rb");
    if (!file_) COHORT_THROW(IoError) << name_ << ": cannot open: out of memory for its gzip state";
    (void)fd.release();  // gzclose closes it now; a failed gzdopen leaves it to `fd`
    gzbuffer(file_, 1 << 17);
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  const std::string& name() const { return name_; }
  int64_t offset() const { return offset_; }

  // Reads up to `bytes` bytes; returns how many arrived (fewer only at the end of the data).
  int64_t read(void* out, int64_t bytes) {
    int64_t got = 0;
    auto* dst = static_cast<unsigned char*>(out);
    while (got < bytes) {
      unsigned chunk = static_cast<unsigned>(std::min<int64_t>(bytes - got, 1 << 30));
      int n = gzread(file_, dst + got, chunk);
      if (n < 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        COHORT_THROW(IoError) << name_ << ": read error at offset " << offset_ + got << ": " << msg;
      }
      if (n == 0) break;
      got += n;
    }
    offset_ += got;
    return got;
  }

  // Reads exactly `bytes` bytes of `what`, or throws "truncated".
  void readExactly(void* out, int64_t bytes, const char* what) {
    int64_t at = offset_;
    int64_t got = read(out, bytes);
    if (got != bytes) {
      COHORT_THROW(IoError) << name_ << ": truncated: expected " << bytes << " bytes of " << what
                            << " at offset " << at << ", got " << got;
    }
  }

  uint32_t readBigEndian32(const char* what) {
    unsigned char b[kHeaderWordBytes];
    readExactly(b, kHeaderWordBytes, what);
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
  }

  // Refuses anything after the announced payload.
  void expectEnd() {
    unsigned char extra;
    int64_t at = offset_;
    if (read(&extra, 1) != 0) {
      COHORT_THROW(IoError) << name_ << ": trailing data after the " << at
                            << " bytes its header announces";
    }
  }

 private:
  std::string name_;
  gzFile file_ = nullptr;
  int64_t offset_ = 0;
};

void checkMagic(GzReader& in, uint32_t expected) {
  uint32_t magic = in.readBigEndian32("header");
  if (magic != expected) {
    COHORT_THROW(IoError) << in.name() << ": bad magic number 0x" << std::hex << magic
                          << " (expected 0x" << expected << ")";
  }
}

// A header dimension, as int64; zero or absurd values are refused.
int64_t readDim(GzReader& in, const char* what) {
  uint32_t d = in.readBigEndian32("header");
  if (d == 0) COHORT_THROW(IoError) << in.name() << ": header announces zero " << what;
  return static_cast<int64_t>(d);
}

}  // namespace

IdxImages readIdxImages(const std::string& path) {
  GzReader in(path);
  checkMagic(in, kIdxImagesMagic);
  IdxImages images;
  images.count = readDim(in, "images");
  images.rows = readDim(in, "rows");
  images.cols = readDim(in, "columns");
  int64_t sampleBytes = images.rows * images.cols;
  if (sampleBytes > kMaxPayloadBytes || images.count * sampleBytes > kMaxPayloadBytes) {
    COHORT_THROW(IoError) << in.name() << ": header announces an implausible size " << images.count
                          << " x " << images.rows << " x " << images.cols;
  }
  images.pixels.resize(static_cast<size_t>(images.count * sampleBytes));
  in.readExactly(images.pixels.data(), images.count * sampleBytes, "pixel data");
  in.expectEnd();
  return images;
}

std::vector<uint8_t> readIdxLabels(const std::string& path) {
  GzReader in(path);
  checkMagic(in, kIdxLabelsMagic);
  int64_t count = readDim(in, "labels");
  if (count > kMaxPayloadBytes) {
    COHORT_THROW(IoError) << in.name() << ": header announces an implausible " << count
                          << " labels";
  }
  std::vector<uint8_t> labels(static_cast<size_t>(count));
  int64_t start = in.offset();
  in.readExactly(labels.data(), count, "label data");
  in.expectEnd();
  for (int64_t i = 0; i < count; ++i) {
    if (labels[static_cast<size_t>(i)] >= kMnistClasses) {
      COHORT_THROW(IoError) << in.name() << ": label " << int{labels[static_cast<size_t>(i)]}
                            << " at offset " << start + i << " is not below " << kMnistClasses;
    }
  }
  return labels;
}

std::unique_ptr<Dataset> readMnist(const std::string& dir, Split split) {
  requireDirectoryIfPresent(dir, "mnist:DIR names the directory that holds the IDX files");
  std::string prefix = dir + (dir.empty() || dir.back() == '/' ? "" : "/");
  prefix += split == Split::kTrain ? "train" : "t10k";
  std::string imagesPath = prefix + "-images-idx3-ubyte";
  std::string labelsPath = prefix + "-labels-idx1-ubyte";
  IdxImages images = readIdxImages(imagesPath);
  std::vector<uint8_t> labels = readIdxLabels(labelsPath);
  if (static_cast<int64_t>(labels.size()) != images.count) {
    COHORT_THROW(IoError) << imagesPath << ": holds " << images.count << " images but "
                          << labelsPath << " holds " << labels.size() << " labels";
  }
  int64_t sample = images.rows * images.cols;
  DatasetContents c;
  c.name = "mnist:" + dir + (split == Split::kTrain ? "/train" : "/test");
  c.inputs = Tensor::empty(Shape{images.count, sample}, cpuAllocator());
  c.targets = Tensor::empty(Shape{images.count}, cpuAllocator());
  c.numClasses = kMnistClasses;
  float* x = c.inputs.data();
  for (size_t e = 0; e < images.pixels.size(); ++e) x[e] = images.pixels[e] / 255.0f;
  for (int64_t i = 0; i < images.count; ++i) c.targets.at(i) = labels[static_cast<size_t>(i)];
  return std::make_unique<Dataset>(std::move(c));
}

}  // namespace cohort::runtime::data
