#include "nn/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <isa-l/crc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <sstream>
#include <system_error>
#include <utility>

#include "nn/checkpoint_format.h"
#include "runtime/error.h"
#include "runtime/unique_fd.h"

namespace cohort::nn {

using namespace detail;

namespace {

std::string errnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

}  // namespace

namespace detail {

std::string oneLine(const std::string& text) {
  constexpr size_t kMaxChars = 1000;
  std::string out;
  for (unsigned char c : text) {
    if (out.size() >= kMaxChars) {
      out += "... (message cut)";
      break;
    }
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

void refuseWithErrno(const std::string& path, const std::string& what) {
  int err = errno;
  Refusal(path) << what << ": " << errnoText(err);
  __builtin_unreachable();
}

std::string hex8(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

std::string byteRange(uint64_t begin, uint64_t end) {
  return "bytes " + std::to_string(begin) + ".." + std::to_string(end);
}

bool isReservedKey(const std::string& key) {
  return key == kFormatKey || key == kHeaderCrcKey || key.rfind(kCrcPrefix, 0) == 0;
}

uint32_t headerCrc(const TensorShapes& shapes, const Metadata& metadata) {
  nlohmann::json canonical = {{"metadata", nlohmann::json::object()},
                              {"tensors", nlohmann::json::object()}};
  for (const auto& [key, value] : metadata) {
    if (key != kHeaderCrcKey) canonical["metadata"][key] = value;
  }
  for (const auto& [name, shape] : shapes) {
    nlohmann::json dims = nlohmann::json::array();
    for (int i = 0; i < shape.rank(); ++i) dims.push_back(shape[i]);
    canonical["tensors"][name] = {{"dtype", "F32"}, {"shape", std::move(dims)}};
  }
  std::string text = canonical.dump();
  return crc32c(text.data(), text.size());
}

}  // namespace detail

namespace {

// The directory and file name of a checkpoint path; InvalidArgument for a path that names a directory.
std::pair<std::string, std::string> splitCheckpointPath(const std::string& path) {
  const size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty()) COHORT_THROW(InvalidArgument) << path << ": the path names a directory (it ends in '/'): give a file name";
  return {dir, base};
}

// Where the writer with process id `pid` writes before renaming: "<dir>/.<base>.tmp.<pid>".
std::string temporaryPath(const std::string& dir, const std::string& base, pid_t pid) {
  return dir + "/." + base + ".tmp." + std::to_string(pid);
}

// Removes "<dir>/.<base>.tmp.<pid>" files whose writer is gone: nobody holds the lock a writer keeps
// on its temporary file until the rename (see writeCheckpoint), and no process <pid> exists (a
// writer of an older Cohort, which took no lock, may still be alive). A file being written by a
// live process is never touched. Returns how many were removed; failures to look are not errors.
size_t removeStaleTemporaries(const std::string& dir, const std::string& base) {
  const std::string prefix = "." + base + ".tmp.";
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return 0;
  size_t removed = 0;
  while (const dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<pid_t>(std::stol(digits));
    if (pid == ::getpid() || (::kill(pid, 0) == 0 || errno == EPERM)) continue;  // ours, or its writer lives
    const std::string file = dir + "/" + name;
    runtime::UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (!fd || ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;  // held: a writer is at work
    if (::unlink(file.c_str()) == 0) ++removed;
  }
  return removed;
}

// Unlinks the temporary file unless a successful rename has consumed it.
class TempFileGuard {
 public:
  explicit TempFileGuard(std::string path) : path_(std::move(path)) {}
  ~TempFileGuard() {
    if (armed_) ::unlink(path_.c_str());
  }
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
  void disarm() { armed_ = false; }

 private:
  std::string path_;
  bool armed_ = true;
};

// ---------------------------------------------------------------------------------------------
// Writing

// cohort: a Cohort checkpoint, whose reserved metadata keys the caller may not use.
void validateForWrite(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const Metadata& metadata, bool cohort) {
  std::set<std::string> names;
  for (const NamedTensor& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) {
      COHORT_THROW(InvalidArgument) << path << ": invalid tensor name '" << t.name << "'";
    }
    if (!names.insert(t.name).second) {
      COHORT_THROW(InvalidArgument) << path << ": duplicate tensor name '" << t.name << "'";
    }
    if (!t.tensor.defined() || !t.tensor.device().isCpu()) {
      COHORT_THROW(InvalidArgument) << path << ": tensor '" << t.name << "' is undefined";
    }
  }
  for (const auto& [key, value] : metadata) {
    if (cohort && isReservedKey(key)) COHORT_THROW(InvalidArgument) << path << ": metadata key '" << key << "' is reserved";
  }
}

// A Cohort checkpoint's metadata: the caller's, its format and the CRCs.
Metadata withCrcs(const std::vector<NamedTensor>& tensors, const Metadata& callerMetadata) {
  Metadata metadata = callerMetadata;
  metadata[kFormatKey] = kCheckpointFormat;
  TensorShapes shapes;
  for (const NamedTensor& t : tensors) {
    metadata[kCrcPrefix + t.name] = hex8(crc32c(t.tensor.data(), t.tensor.bytes()));
    shapes.emplace_back(t.name, t.tensor.shape());
  }
  try {
    metadata[kHeaderCrcKey] = hex8(headerCrc(shapes, metadata));
  } catch (const nlohmann::json::type_error& e) {
    COHORT_THROW(InvalidArgument) << "checkpoint names and metadata must be UTF-8: " << e.what();
  }
  return metadata;
}

// The 8-byte length followed by the JSON header, space-padded to a multiple of 8 bytes (no
// "__metadata__" when there is none).
std::string encodeHeader(const std::vector<NamedTensor>& tensors, const Metadata& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header[kMetadataKey] = Json(metadata);
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    Json shape = Json::array();
    for (int i = 0; i < t.tensor.rank(); ++i) shape.push_back(t.tensor.dim(i));
    uint64_t end = offset + t.tensor.bytes();
    header[t.name] = {
        {"dtype", "F32"}, {"shape", std::move(shape)}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string json;
  try {
    json = header.dump();
  } catch (const nlohmann::json::type_error& e) {
    COHORT_THROW(InvalidArgument) << "safetensors names and metadata must be UTF-8: " << e.what();
  }
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

void writeAll(int fd, const void* data, size_t bytes, const std::string& path,
              const std::string& tmp) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, std::min(bytes, kMaxSyscallBytes));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      refuseWithErrno(path, "cannot write temporary file " + tmp);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

// Makes the rename durable: the directory entry lives in the directory's own data.
void fsyncDirectory(const std::string& dir, const std::string& path) {
  runtime::UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd || ::fsync(fd.get()) != 0) {
    refuseWithErrno(path, "written, but cannot fsync directory " + dir);
  }
}

}  // namespace

uint32_t crc32c(const void* data, size_t bytes, uint32_t previous) {
  // ISA-L's crc32_iscsi neither inverts its seed nor its result; standard CRC32C does both.
  unsigned int state = ~previous;
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  while (bytes > 0) {
    size_t chunk = std::min(bytes, kMaxSyscallBytes);
    state = crc32_iscsi(p, static_cast<int>(chunk), state);
    p += chunk;
    bytes -= chunk;
  }
  return ~state;
}

void writeFileAtomically(const std::string& path, const std::vector<std::span<const std::byte>>& parts) {
  const auto [dir, base] = splitCheckpointPath(path);
  removeStaleTemporaries(dir, base);
  const std::string tmp = temporaryPath(dir, base, ::getpid());
  runtime::UniqueFd fd(
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd) {
    refuseWithErrno(path, "cannot create temporary file " + tmp);
  }
  TempFileGuard guard(tmp);
  // Held on a second open file until the rename, so that another run's removeStaleTemporaries
  // never takes this file for an orphan (the lock goes with the process, however it ends).
  runtime::UniqueFd lock(::open(tmp.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!lock || ::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    refuseWithErrno(path, "cannot lock temporary file " + tmp);
  }
  for (std::span<const std::byte> part : parts) writeAll(fd.get(), part.data(), part.size(), path, tmp);
  if (::fsync(fd.get()) != 0) {
    refuseWithErrno(path, "cannot fsync temporary file " + tmp);
  }
  if (fd.close() != 0) {
    refuseWithErrno(path, "cannot close temporary file " + tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    refuseWithErrno(path, "cannot rename temporary file " + tmp + " over it");
  }
  guard.disarm();
  fsyncDirectory(dir, path);
}

namespace {

// Writes a safetensors file atomically (see writeCheckpoint); cohort: with the format and the CRCs.
void writeFile(const std::string& path, const std::vector<NamedTensor>& tensors, const Metadata& metadata,
               bool cohort) {
  if (std::any_of(tensors.begin(), tensors.end(), [](const NamedTensor& t) { return t.tensor.device().isCuda(); })) {
    // GPU tensors are written from host copies (the caller has synchronised the stream that wrote them).
    std::vector<NamedTensor> host;
    for (const NamedTensor& t : tensors) host.push_back({t.name, t.tensor.device().isCuda() ? t.tensor.clone() : t.tensor});
    writeFile(path, host, metadata, cohort);
    return;
  }
  validateForWrite(path, tensors, metadata, cohort);
  const std::string header = encodeHeader(tensors, cohort ? withCrcs(tensors, metadata) : metadata);
  std::vector<std::span<const std::byte>> parts{std::as_bytes(std::span(header))};
  for (const NamedTensor& t : tensors) parts.push_back(std::as_bytes(std::span(t.tensor.data(), t.tensor.numel())));
  writeFileAtomically(path, parts);
}

}  // namespace

void writeCheckpoint(const std::string& path, const std::vector<NamedTensor>& tensors,
                     const Metadata& metadata) {
  writeFile(path, tensors, metadata, true);
}

void writeSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const Metadata& metadata) {
  writeFile(path, tensors, metadata, false);
}

void checkOutputFile(const std::string& path, const std::string& what) {
  const auto [dir, base] = splitCheckpointPath(path);
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    Refusal(path) << "is a directory; " << what << " need a file name (e.g. " << path << "/" << (what == "checkpoints" ? "run.st" : "out") << ")";
  }
  if (::stat(dir.c_str(), &st) != 0) refuseWithErrno(path, "cannot write " + what + " into directory " + dir);
  if (!S_ISDIR(st.st_mode)) Refusal(path) << "cannot write " << what << " into " << dir << ": not a directory";
  // The proof that a writer will be able to create its file: create one (exclusively, under another
  // name than any writer uses) and remove it.
  const std::string probe = dir + "/." + base + ".probe." + std::to_string(::getpid());
  runtime::UniqueFd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd) refuseWithErrno(path, "cannot write " + what + " into directory " + dir);
  fd.close();
  ::unlink(probe.c_str());
}

size_t prepareCheckpointDestination(const std::string& path) {
  checkOutputFile(path, "checkpoints");
  const auto [dir, base] = splitCheckpointPath(path);
  return removeStaleTemporaries(dir, base);
}

CheckpointLock::CheckpointLock(const std::string& path) {
  const auto [dir, base] = splitCheckpointPath(path);
  lockPath_ = dir + "/." + base + ".lock";
  // The file must still be the one locked (another holder may have removed it meanwhile): else again.
  for (int attempt = 0; attempt < 100; ++attempt) {
    runtime::UniqueFd fd(::open(lockPath_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!fd) refuseWithErrno(path, "cannot create the lock file " + lockPath_);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      char holder[256] = {};
      const ssize_t n = ::pread(fd.get(), holder, sizeof holder - 1, 0);
      std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "a process that has not said who it is";
      while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
      Refusal(path) << "another run is writing its checkpoints here (" << who << "; " << lockPath_
                    << "): stop it first, or give this run another --checkpoint";
    }
    struct stat opened {}, named {};
    if (::fstat(fd.get(), &opened) != 0 || ::stat(lockPath_.c_str(), &named) != 0 || opened.st_ino != named.st_ino ||
        opened.st_dev != named.st_dev) {
      continue;
    }
    char host[256] = "unknown host";
    ::gethostname(host, sizeof host - 1);
    const std::string me = "pid " + std::to_string(::getpid()) + " on " + host + "\n";
    if (::ftruncate(fd.get(), 0) == 0) (void)::pwrite(fd.get(), me.data(), me.size(), 0);  // only says who: best effort
    fd_ = fd.release();
    return;
  }
  Refusal(path) << "cannot take the lock file " << lockPath_ << ": it keeps being replaced";
}

CheckpointLock::CheckpointLock(CheckpointLock&& other) noexcept
    : lockPath_(std::move(other.lockPath_)), fd_(std::exchange(other.fd_, -1)) {}

CheckpointLock::~CheckpointLock() {
  if (fd_ < 0) return;
  ::unlink(lockPath_.c_str());  // while still held: a run that opened it before finds it gone and tries again
  ::close(fd_);
}

const runtime::Tensor* Checkpoint::find(const std::string& name) const {
  for (const NamedTensor& t : tensors) {
    if (t.name == name) return &t.tensor;
  }
  return nullptr;
}

}  // namespace cohort::nn
