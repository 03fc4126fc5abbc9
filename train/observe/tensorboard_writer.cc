#include "train/observe/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "nn/checkpoint.h"  // nn::crc32c
#include "runtime/error.h"
#include "train/observe/tensorboard_event.pb.h"

namespace cohort::train {
namespace {

// Buffered records go out once they reach this size, or when a scalar comes this long after the
// last write, so that a live TensorBoard sees a run that never calls flush() within seconds.
constexpr size_t kFlushBytes = 64 * 1024;
constexpr std::chrono::seconds kFlushInterval{5};

// TFRecord's masked CRC: a CRC stored next to the data it covers is masked so that the CRC of
// bytes that themselves contain CRCs does not degenerate.
uint32_t maskedCrc(const void* data, size_t bytes) {
  const uint32_t crc = nn::crc32c(data, bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void appendLittleEndian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// One TFRecord: length, its masked CRC, the data, the data's masked CRC.
void appendRecord(std::string& out, const std::string& data) {
  std::string length;
  appendLittleEndian(length, data.size(), 8);
  out += length;
  appendLittleEndian(out, maskedCrc(length.data(), length.size()), 4);
  out += data;
  appendLittleEndian(out, maskedCrc(data.data(), data.size()), 4);
}

double secondsSinceEpoch() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Protobuf's parsers (TensorBoard's Python among them) refuse a proto3 string that is not UTF-8, so
// such a tag is refused here rather than written into a file TensorBoard then cannot read.
bool isUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t extra;
    uint32_t code;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      extra = 1, code = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2, code = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3, code = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;  // truncated sequence
    for (size_t k = 1; k <= extra; ++k) {
      const auto next = static_cast<unsigned char>(s[i + k]);
      if ((next & 0xc0) != 0x80) return false;
      code = (code << 6) | (next & 0x3f);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
    static constexpr uint32_t kSmallest[] = {0, 0x80, 0x800, 0x10000};
    if (code < kSmallest[extra] || (code >= 0xd800 && code <= 0xdfff) || code > 0x10ffff) return false;
    i += extra + 1;
  }
  return true;
}

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  std::string host(name);
  for (char& c : host) {
    if (c == '/') c = '_';  // a name, never a path
  }
  return host;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  if (dir.empty()) COHORT_THROW(InvalidArgument) << "TensorBoard directory is empty";
  // As every output path: the directory itself is created, the ones above it must exist.
  std::error_code error;
  std::filesystem::create_directory(dir, error);
  if (error) COHORT_THROW(IoError) << dir << ": cannot create the TensorBoard directory: " << error.message();
  if (!std::filesystem::is_directory(dir, error)) COHORT_THROW(IoError) << dir << ": not a directory (TensorBoard writes its events into one)";

  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%010lld",
                static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(
                                           std::chrono::system_clock::now().time_since_epoch())
                                           .count()));
  const std::string stem =
      dir + "/events.out.tfevents." + seconds + "." + hostName() + "." + std::to_string(::getpid()) + ".";
  // O_EXCL finds the first free counter without any state shared between writers.
  for (int counter = 0; !fd_; ++counter) {
    path_ = stem + std::to_string(counter);
    fd_ = runtime::UniqueFd(::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
    const int openErrno = errno;
    if (!fd_ && (openErrno != EEXIST || counter == 1'000'000)) {
      COHORT_THROW(IoError) << path_ << ": cannot create the TensorBoard event file: " << std::strerror(openErrno);
    }
  }

  tensorboard::Event event;
  event.set_wall_time(secondsSinceEpoch());
  event.set_file_version(kTensorBoardFileVersion);
  std::string bytes;
  COHORT_CHECK(event.SerializeToString(&bytes));
  append(bytes);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  try {
    flush();
  } catch (const Error&) {
    // Documented: a destructor cannot report it; flush() first to see it.
  }
}

void TensorBoardWriter::scalar(std::string_view tag, int64_t step, double value) {
  scalar(TensorBoardScalar{.tag = tag, .step = step, .value = value, .wallTime = std::nullopt});
}

void TensorBoardWriter::scalar(const TensorBoardScalar& scalar) {
  if (!isUtf8(scalar.tag)) COHORT_THROW(InvalidArgument) << path_ << ": TensorBoard tag is not UTF-8";
  tensorboard::Event event;
  event.set_wall_time(scalar.wallTime ? *scalar.wallTime : secondsSinceEpoch());
  event.set_step(scalar.step);
  tensorboard::Summary::Value* value = event.mutable_summary()->add_value();
  value->set_tag(std::string(scalar.tag));
  value->set_simple_value(static_cast<float>(scalar.value));
  std::string bytes;
  COHORT_CHECK(event.SerializeToString(&bytes)) << scalar.tag;
  append(bytes);
  if (pending_.size() >= kFlushBytes || std::chrono::steady_clock::now() - lastWrite_ >= kFlushInterval) flush();
}

void TensorBoardWriter::flush() {
  if (!failure_.empty()) COHORT_THROW(IoError) << failure_;
  if (pending_.empty()) return;
  writeAll(pending_);
  pending_.clear();
  lastWrite_ = std::chrono::steady_clock::now();
}

void TensorBoardWriter::append(const std::string& event) {
  if (!failure_.empty()) COHORT_THROW(IoError) << failure_;
  appendRecord(pending_, event);
}

void TensorBoardWriter::writeAll(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd_.get(), bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int writeErrno = errno;
      failure_ = path_ + ": cannot write the TensorBoard event file: " +
                 (n < 0 ? std::strerror(writeErrno) : "write returned 0");
      COHORT_THROW(IoError) << failure_;
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace cohort::train
