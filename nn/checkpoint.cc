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
#include <sstream>
#include <system_error>
#include <utility>

#include "runtime/error.h"
#include "runtime/unique_fd.h"

namespace cohort::nn {
namespace {

// ordered_json keeps the header's key order, so tensors of zero bytes (which share an offset with
// their neighbour) come back in the order they were written.
using Json = nlohmann::ordered_json;

constexpr size_t kMaxSyscallBytes = size_t{1} << 30;  // also ISA-L's limit: its length is an int
constexpr size_t kReadChunkBytes = size_t{8} << 20;   // CRC each chunk while it is still in cache
constexpr char kMetadataKey[] = "__metadata__";
constexpr char kFormatKey[] = "format";
constexpr char kCrcPrefix[] = "crc32c.";
constexpr char kHeaderCrcKey[] = "header_crc32c";

using TensorShapes = std::vector<std::pair<std::string, runtime::Shape>>;

std::string errnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

// Escapes everything but printable ASCII and caps the length, so a message stays one readable line
// whatever a corrupt file holds (nlohmann quotes the offending token, which may be megabytes).
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

// Collects "<path>: <problem>" with operator<< and throws it as a one-line IoError at the end of
// the full expression:  Refusal(path) << "header length " << n << " is absurd";
class Refusal {
 public:
  explicit Refusal(const std::string& path) { os_ << path << ": "; }
  template <class T>
  Refusal& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  [[noreturn]] ~Refusal() noexcept(false) { throw IoError(oneLine(os_.str())); }

 private:
  std::ostringstream os_;
};

// Throws "<path>: <what>: <errno text>", reading errno before anything can clobber it.
[[noreturn]] void refuseWithErrno(const std::string& path, const std::string& what) {
  int err = errno;
  Refusal(path) << what << ": " << errnoText(err);
  __builtin_unreachable();
}

std::string hex8(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// [begin, end) as "bytes begin..end".
std::string byteRange(uint64_t begin, uint64_t end) {
  return "bytes " + std::to_string(begin) + ".." + std::to_string(end);
}

// The directory and file name of a checkpoint path; InvalidArgument for a path that names a directory.
std::pair<std::string, std::string> splitCheckpointPath(const std::string& path) {
  const size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty()) COHORT_THROW(InvalidArgument) << path << ": checkpoint path names a directory";
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

void validateForWrite(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const Metadata& metadata) {
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
    if (key == kFormatKey || key == kHeaderCrcKey || key.rfind(kCrcPrefix, 0) == 0) {
      COHORT_THROW(InvalidArgument) << path << ": metadata key '" << key << "' is reserved";
    }
  }
}

// CRC32C of the header's meaning, independent of key order, whitespace and data layout: the
// compact, key-sorted JSON
//   {"metadata":{every key but header_crc32c},"tensors":{name:{"dtype":"F32","shape":[...]}}}
// that Python's json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=False) produces.
// Throws nlohmann's type_error for strings that are not UTF-8.
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

// The 8-byte length followed by the JSON header, space-padded to a multiple of 8 bytes.
std::string encodeHeader(const std::vector<NamedTensor>& tensors, const Metadata& callerMetadata) {
  Metadata metadata = callerMetadata;
  metadata[kFormatKey] = kCheckpointFormat;
  TensorShapes shapes;
  for (const NamedTensor& t : tensors) {
    metadata[kCrcPrefix + t.name] = hex8(crc32c(t.tensor.data(), t.tensor.bytes()));
    shapes.emplace_back(t.name, t.tensor.shape());
  }
  Json header = Json::object();
  try {
    metadata[kHeaderCrcKey] = hex8(headerCrc(shapes, metadata));
  } catch (const nlohmann::json::type_error& e) {
    COHORT_THROW(InvalidArgument) << "checkpoint names and metadata must be UTF-8: " << e.what();
  }
  header[kMetadataKey] = Json(metadata);
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    Json shape = Json::array();
    for (int i = 0; i < t.tensor.rank(); ++i) shape.push_back(t.tensor.dim(i));
    uint64_t end = offset + t.tensor.bytes();
    header[t.name] = {
        {"dtype", "F32"}, {"shape", std::move(shape)}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string json = header.dump();
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

void writeCheckpoint(const std::string& path, const std::vector<NamedTensor>& tensors,
                     const Metadata& metadata) {
  if (std::any_of(tensors.begin(), tensors.end(), [](const NamedTensor& t) { return t.tensor.device().isCuda(); })) {
    // GPU tensors are written from host copies (the caller has synchronised the stream that wrote them).
    std::vector<NamedTensor> host;
    for (const NamedTensor& t : tensors) host.push_back({t.name, t.tensor.device().isCuda() ? t.tensor.clone() : t.tensor});
    writeCheckpoint(path, host, metadata);
    return;
  }
  validateForWrite(path, tensors, metadata);
  const auto [dir, base] = splitCheckpointPath(path);
  removeStaleTemporaries(dir, base);
  const std::string header = encodeHeader(tensors, metadata);

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
  writeAll(fd.get(), header.data(), header.size(), path, tmp);
  for (const NamedTensor& t : tensors) {
    writeAll(fd.get(), t.tensor.data(), t.tensor.bytes(), path, tmp);
  }
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

size_t prepareCheckpointDestination(const std::string& path) {
  const auto [dir, base] = splitCheckpointPath(path);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) refuseWithErrno(path, "cannot write checkpoints into directory " + dir);
  if (!S_ISDIR(st.st_mode)) Refusal(path) << "cannot write checkpoints into " << dir << ": not a directory";
  // The proof that the writer will be able to create its temporary file: create one (exclusively,
  // under another name than any writer uses) and remove it.
  const std::string probe = dir + "/." + base + ".probe." + std::to_string(::getpid());
  runtime::UniqueFd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd) refuseWithErrno(path, "cannot write checkpoints into directory " + dir);
  fd.close();
  ::unlink(probe.c_str());
  return removeStaleTemporaries(dir, base);
}

const runtime::Tensor* Checkpoint::find(const std::string& name) const {
  for (const NamedTensor& t : tensors) {
    if (t.name == name) return &t.tensor;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Reading

namespace {

// One tensor's header entry. Offsets are relative to the byte buffer.
struct Entry {
  std::string name;
  runtime::Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t numel = 0;
  uint32_t crc = 0;
};

class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& path);
  Checkpoint read();

 private:
  Json parseHeader(uint64_t headerBytes);
  Metadata parseMetadata(const Json& meta);
  Entry parseEntry(const std::string& name, const Json& value);
  runtime::Shape parseShape(const std::string& name, const Json& shape, uint64_t* numel);
  uint32_t parseCrc(const std::string& what, const std::string& text);
  void attachCrcs(std::vector<Entry>& entries, const Metadata& metadata);
  void checkHeaderCrc(const std::vector<Entry>& entries, const Metadata& metadata);
  void checkLayout(std::vector<Entry>& entries, uint64_t bufferBytes);
  runtime::Tensor load(const Entry& e);
  void preadAll(void* dst, size_t bytes, uint64_t offset);

  std::string path_;
  runtime::UniqueFd fd_;
  uint64_t fileBytes_ = 0;
  uint64_t dataStart_ = 0;  // file offset of the byte buffer
};

CheckpointReader::CheckpointReader(const std::string& path)
    : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
  if (!fd_) refuseWithErrno(path_, "cannot open checkpoint");
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) refuseWithErrno(path_, "cannot stat");
  if (!S_ISREG(st.st_mode)) Refusal(path_) << "not a regular file";
  fileBytes_ = static_cast<uint64_t>(st.st_size);
}

void CheckpointReader::preadAll(void* dst, size_t bytes, uint64_t offset) {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    ssize_t n =
        ::pread(fd_.get(), p, std::min(bytes, kMaxSyscallBytes), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) refuseWithErrno(path_, "read failed at byte " + std::to_string(offset));
    if (n == 0) Refusal(path_) << "unexpected end of file at byte " << offset << " (file shrank?)";
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

Json CheckpointReader::parseHeader(uint64_t headerBytes) {
  std::string text(headerBytes, '\0');
  preadAll(text.data(), text.size(), 8);
  // nlohmann keeps the last of duplicate keys silently; watch the parse to refuse them instead.
  std::vector<std::set<std::string>> openObjects;
  std::string duplicate;
  bool duplicateIsTensor = false;
  auto watch = [&](int, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) openObjects.emplace_back();
    if (event == Json::parse_event_t::object_end) openObjects.pop_back();
    if (event == Json::parse_event_t::key && duplicate.empty() &&
        !openObjects.back().insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
      duplicateIsTensor = openObjects.size() == 1;
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text.begin(), text.end(), watch);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte counts from 1 within the header; the header starts at file byte 8.
    Refusal(path_) << "header is not valid JSON (near byte " << 7 + std::max<size_t>(e.byte, 1)
                   << "): " << e.what();
  } catch (const nlohmann::json::exception& e) {
    Refusal(path_) << "header is not valid JSON: " << e.what();
  }
  if (!duplicate.empty()) {
    Refusal(path_) << "duplicate " << (duplicateIsTensor ? "tensor name" : "key") << " '"
                   << duplicate << "' in the header";
  }
  if (!header.is_object()) Refusal(path_) << "header is not a JSON object";
  return header;
}

Metadata CheckpointReader::parseMetadata(const Json& meta) {
  if (!meta.is_object()) Refusal(path_) << "\"" << kMetadataKey << "\" is not a JSON object";
  Metadata out;
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string()) Refusal(path_) << "metadata value for '" << key << "' is not a string";
    out[key] = value.get<std::string>();
  }
  auto format = out.find(kFormatKey);
  if (format == out.end()) Refusal(path_) << "not a Cohort checkpoint: metadata has no \"format\"";
  if (format->second != kCheckpointFormat) {
    Refusal(path_) << "unsupported checkpoint format '" << format->second << "' (expected "
                   << kCheckpointFormat << ")";
  }
  return out;
}

runtime::Shape CheckpointReader::parseShape(const std::string& name, const Json& shape,
                                            uint64_t* numel) {
  if (!shape.is_array()) Refusal(path_) << "tensor '" << name << "': shape is not an array";
  if (shape.size() > static_cast<size_t>(runtime::kMaxDims)) {
    Refusal(path_) << "tensor '" << name << "': rank " << shape.size() << " above the supported "
                   << runtime::kMaxDims;
  }
  runtime::Shape out;
  bool hasZero = false;
  uint64_t product = 1;
  bool overflow = false;
  for (const Json& d : shape) {
    if (d.is_number_integer() && !d.is_number_unsigned()) {
      Refusal(path_) << "tensor '" << name << "': negative dimension " << d.dump();
    }
    if (!d.is_number_unsigned()) {
      Refusal(path_) << "tensor '" << name << "': dimension " << d.dump() << " is not an integer";
    }
    uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      Refusal(path_) << "tensor '" << name << "': dimension " << v << " too large";
    }
    hasZero = hasZero || v == 0;
    overflow = overflow || __builtin_mul_overflow(product, v, &product);
    out.push(static_cast<int64_t>(v));
  }
  if (overflow && !hasZero) Refusal(path_) << "tensor '" << name << "': too many elements";
  *numel = hasZero ? 0 : product;
  return out;
}

Entry CheckpointReader::parseEntry(const std::string& name, const Json& value) {
  if (!value.is_object()) Refusal(path_) << "entry for tensor '" << name << "' is not an object";
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) Refusal(path_) << "tensor '" << name << "' has no \"" << key << "\"";
  }
  const Json& dtype = value["dtype"];
  if (!dtype.is_string()) Refusal(path_) << "tensor '" << name << "': dtype is not a string";
  if (dtype.get<std::string>() != "F32") {
    Refusal(path_) << "tensor '" << name << "': unsupported dtype '" << dtype.get<std::string>()
                   << "' (only F32)";
  }
  Entry e;
  e.name = name;
  e.shape = parseShape(name, value["shape"], &e.numel);
  const Json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    Refusal(path_) << "tensor '" << name << "': data_offsets " << offsets.dump()
                   << " is not a pair of non-negative integers";
  }
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  if (e.end < e.begin) {
    Refusal(path_) << "tensor '" << name << "': data_offsets " << offsets.dump()
                   << " end before they begin";
  }
  if (e.numel > (e.end - e.begin) / sizeof(float) || e.numel * sizeof(float) != e.end - e.begin) {
    Refusal(path_) << "tensor '" << name << "': shape " << e.shape.str() << " needs " << e.numel
                   << " x 4 bytes but data_offsets " << offsets.dump() << " span "
                   << e.end - e.begin;
  }
  return e;
}

// Moves each tensor's "crc32c.<name>" out of the metadata into its entry.
uint32_t CheckpointReader::parseCrc(const std::string& what, const std::string& text) {
  bool ok = text.size() == 8 && std::all_of(text.begin(), text.end(), [](char c) {
              return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
            });
  if (!ok) Refusal(path_) << what << " is '" << text << "', not 8 lowercase hex digits";
  return static_cast<uint32_t>(std::stoul(text, nullptr, 16));
}

// Copies each tensor's "crc32c.<name>" into its entry; refuses CRCs of tensors that do not exist.
void CheckpointReader::attachCrcs(std::vector<Entry>& entries, const Metadata& metadata) {
  std::set<std::string> names;
  for (Entry& e : entries) {
    auto it = metadata.find(kCrcPrefix + e.name);
    if (it == metadata.end()) Refusal(path_) << "missing crc32c for tensor '" << e.name << "'";
    e.crc = parseCrc("crc32c for tensor '" + e.name + "'", it->second);
    names.insert(e.name);
  }
  const std::string prefix = kCrcPrefix;
  for (auto it = metadata.lower_bound(prefix); it != metadata.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    if (names.count(it->first.substr(prefix.size())) == 0) {
      Refusal(path_) << "metadata has " << it->first << " but no such tensor";
    }
  }
}

// Catches what no tensor CRC covers: altered names, shapes and metadata.
void CheckpointReader::checkHeaderCrc(const std::vector<Entry>& entries, const Metadata& metadata) {
  auto it = metadata.find(kHeaderCrcKey);
  if (it == metadata.end()) Refusal(path_) << "missing " << kHeaderCrcKey << " in metadata";
  uint32_t stored = parseCrc(kHeaderCrcKey, it->second);
  TensorShapes shapes;
  for (const Entry& e : entries) shapes.emplace_back(e.name, e.shape);
  uint32_t computed = headerCrc(shapes, metadata);
  if (stored != computed) {
    Refusal(path_) << kHeaderCrcKey << " mismatch (header " << byteRange(8, dataStart_)
                   << "): stored " << hex8(stored) << ", computed " << hex8(computed)
                   << "; tensor names, shapes or metadata were altered";
  }
}

// The caller's metadata: everything but the reserved keys.
Metadata withoutReservedKeys(Metadata metadata) {
  for (auto it = metadata.begin(); it != metadata.end();) {
    const std::string& key = it->first;
    bool reserved = key == kFormatKey || key == kHeaderCrcKey || key.rfind(kCrcPrefix, 0) == 0;
    it = reserved ? metadata.erase(it) : std::next(it);
  }
  return metadata;
}

// Sorts entries into file order and checks that they tile the byte buffer exactly.
void CheckpointReader::checkLayout(std::vector<Entry>& entries, uint64_t bufferBytes) {
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.end > bufferBytes) {
      Refusal(path_) << "tensor '" << e.name << "' ("
                     << byteRange(dataStart_ + e.begin, dataStart_ + e.end)
                     << ") runs past the end of the file (" << fileBytes_ << " bytes)";
    }
    if (e.begin < covered) {
      Refusal(path_) << "tensor '" << e.name << "' ("
                     << byteRange(dataStart_ + e.begin, dataStart_ + e.end) << ") overlaps tensor '"
                     << previous->name << "' ("
                     << byteRange(dataStart_ + previous->begin, dataStart_ + previous->end) << ")";
    }
    if (e.begin > covered) {
      Refusal(path_) << byteRange(dataStart_ + covered, dataStart_ + e.begin)
                     << " are not covered by any tensor";
    }
    covered = e.end;
    previous = &e;
  }
  if (covered != bufferBytes) {
    Refusal(path_) << byteRange(dataStart_ + covered, fileBytes_)
                   << " at the end are not covered by any tensor";
  }
}

runtime::Tensor CheckpointReader::load(const Entry& e) {
  runtime::Tensor t = runtime::Tensor::empty(e.shape, runtime::cpuAllocator());
  char* dst = reinterpret_cast<char*>(t.data());
  uint32_t crc = 0;
  for (uint64_t done = 0; done < e.end - e.begin;) {
    size_t chunk = static_cast<size_t>(std::min<uint64_t>(e.end - e.begin - done, kReadChunkBytes));
    preadAll(dst + done, chunk, dataStart_ + e.begin + done);
    crc = crc32c(dst + done, chunk, crc);
    done += chunk;
  }
  if (crc != e.crc) {
    Refusal(path_) << "crc32c mismatch for tensor '" << e.name << "' ("
                   << byteRange(dataStart_ + e.begin, dataStart_ + e.end) << "): stored "
                   << hex8(e.crc) << ", computed " << hex8(crc);
  }
  return t;
}

Checkpoint CheckpointReader::read() {
  if (fileBytes_ < 8) {
    Refusal(path_) << "file is " << fileBytes_ << " bytes, shorter than the 8-byte header length";
  }
  unsigned char lengthBytes[8];
  preadAll(lengthBytes, 8, 0);
  uint64_t headerBytes = 0;
  for (int i = 7; i >= 0; --i) headerBytes = (headerBytes << 8) | lengthBytes[i];
  if (headerBytes > kMaxCheckpointHeaderBytes) {
    Refusal(path_) << "header length " << headerBytes << " at byte 0 is absurd (limit "
                   << kMaxCheckpointHeaderBytes << ")";
  }
  if (headerBytes > fileBytes_ - 8) {
    Refusal(path_) << "header length " << headerBytes
                   << " at byte 0 runs past the end of the file (" << fileBytes_ << " bytes)";
  }
  dataStart_ = 8 + headerBytes;
  Json header = parseHeader(headerBytes);

  Metadata metadata;
  bool sawMetadata = false;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      metadata = parseMetadata(value);
      sawMetadata = true;
    } else {
      entries.push_back(parseEntry(key, value));
    }
  }
  if (!sawMetadata) Refusal(path_) << "not a Cohort checkpoint: header has no \"__metadata__\"";
  attachCrcs(entries, metadata);
  checkLayout(entries, fileBytes_ - dataStart_);
  checkHeaderCrc(entries, metadata);

  Checkpoint out;
  out.tensors.reserve(entries.size());
  for (const Entry& e : entries) out.tensors.push_back({e.name, load(e)});
  out.metadata = withoutReservedKeys(std::move(metadata));
  return out;
}

}  // namespace

Checkpoint readCheckpoint(const std::string& path) { return CheckpointReader(path).read(); }

}  // namespace cohort::nn
