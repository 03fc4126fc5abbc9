// Reading safetensors files: Cohort's checkpoints (readCheckpoint) and any other (readSafetensors).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <limits>
#include <set>

#include "nn/checkpoint.h"
#include "nn/checkpoint_format.h"
#include "runtime/dtype.h"
#include "runtime/printable.h"
#include "runtime/unique_fd.h"

namespace cohort::nn {

using namespace detail;

namespace {

// Text from the file (a tensor name, a metadata key or value, JSON) as a message quotes it: escape
// codes and invalid UTF-8 as \xNN, cut to 120 bytes (issue 44: they reached the terminal raw).
std::string shown(const std::string& text) { return runtime::printable(text, 120); }

// The element types read: F32 as it is, F16 and BF16 (readSafetensors only) widened to float32.
enum class Dtype { kF32, kF16, kBF16 };

size_t elementBytes(Dtype d) { return d == Dtype::kF32 ? 4 : 2; }

float widen(uint16_t bits, Dtype d) {
  if (d == Dtype::kBF16) return runtime::toFloat(runtime::Bf16{bits});
  return static_cast<float>(std::bit_cast<_Float16>(bits));
}

// One tensor's header entry. Offsets are relative to the byte buffer.
struct Entry {
  std::string name;
  runtime::Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t numel = 0;
  uint32_t crc = 0;
  Dtype dtype = Dtype::kF32;
};

// any: readSafetensors's reader (any safetensors file; a Cohort checkpoint's CRCs are still checked).
class CheckpointReader {
 public:
  CheckpointReader(const std::string& path, bool any);
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
  bool any_ = false;     // any safetensors file will do
  bool cohort_ = false;  // the file says it is a Cohort checkpoint
  runtime::UniqueFd fd_;
  uint64_t fileBytes_ = 0;
  uint64_t dataStart_ = 0;  // file offset of the byte buffer
};

CheckpointReader::CheckpointReader(const std::string& path, bool any)
    : path_(path), any_(any), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
  if (!fd_) refuseWithErrno(path_, "cannot open checkpoint");
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) refuseWithErrno(path_, "cannot stat");
  if (!S_ISREG(st.st_mode)) Refusal(path_) << "not a regular file";
  fileBytes_ = static_cast<uint64_t>(st.st_size);
}

void CheckpointReader::preadAll(void* dst, size_t bytes, uint64_t offset) {
  runtime::readFullyAt(fd_.get(), dst, bytes, offset, path_);
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
                   << "): " << runtime::printable(e.what(), 200);
  } catch (const nlohmann::json::exception& e) {
    Refusal(path_) << "header is not valid JSON: " << runtime::printable(e.what(), 200);
  }
  if (!duplicate.empty()) {
    Refusal(path_) << "duplicate " << (duplicateIsTensor ? "tensor name" : "key") << " '"
                   << shown(duplicate) << "' in the header";
  }
  if (!header.is_object()) Refusal(path_) << "header is not a JSON object";
  return header;
}

Metadata CheckpointReader::parseMetadata(const Json& meta) {
  if (!meta.is_object()) Refusal(path_) << "\"" << kMetadataKey << "\" is not a JSON object";
  Metadata out;
  for (const auto& [key, value] : meta.items()) {
    if (!value.is_string()) Refusal(path_) << "metadata value for '" << shown(key) << "' is not a string";
    out[key] = value.get<std::string>();
  }
  auto format = out.find(kFormatKey);
  cohort_ = format != out.end() && format->second == kCheckpointFormat;
  if (any_) return out;
  if (format == out.end()) Refusal(path_) << "not a Cohort checkpoint: metadata has no \"format\"";
  if (format->second != kCheckpointFormat) {
    Refusal(path_) << "unsupported checkpoint format '" << shown(format->second) << "' (expected "
                   << kCheckpointFormat << ")";
  }
  return out;
}

runtime::Shape CheckpointReader::parseShape(const std::string& name, const Json& shape,
                                            uint64_t* numel) {
  if (!shape.is_array()) Refusal(path_) << "tensor '" << shown(name) << "': shape is not an array";
  if (shape.size() > static_cast<size_t>(runtime::kMaxDims)) {
    Refusal(path_) << "tensor '" << shown(name) << "': rank " << shape.size() << " above the supported "
                   << runtime::kMaxDims;
  }
  runtime::Shape out;
  bool hasZero = false;
  uint64_t product = 1;
  bool overflow = false;
  for (const Json& d : shape) {
    if (d.is_number_integer() && !d.is_number_unsigned()) {
      Refusal(path_) << "tensor '" << shown(name) << "': negative dimension " << shown(d.dump());
    }
    if (!d.is_number_unsigned()) {
      Refusal(path_) << "tensor '" << shown(name) << "': dimension " << shown(d.dump()) << " is not an integer";
    }
    uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      Refusal(path_) << "tensor '" << shown(name) << "': dimension " << v << " too large";
    }
    hasZero = hasZero || v == 0;
    overflow = overflow || __builtin_mul_overflow(product, v, &product);
    out.push(static_cast<int64_t>(v));
  }
  if (overflow && !hasZero) Refusal(path_) << "tensor '" << shown(name) << "': too many elements";
  *numel = hasZero ? 0 : product;
  return out;
}

Entry CheckpointReader::parseEntry(const std::string& name, const Json& value) {
  if (!value.is_object()) Refusal(path_) << "entry for tensor '" << shown(name) << "' is not an object";
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) Refusal(path_) << "tensor '" << shown(name) << "' has no \"" << key << "\"";
  }
  const Json& dtype = value["dtype"];
  if (!dtype.is_string()) Refusal(path_) << "tensor '" << shown(name) << "': dtype is not a string";
  Entry e;
  const std::string type = dtype.get<std::string>();
  if (type == "F32") {
    e.dtype = Dtype::kF32;
  } else if (any_ && (type == "F16" || type == "BF16")) {
    e.dtype = type == "F16" ? Dtype::kF16 : Dtype::kBF16;
  } else {
    Refusal(path_) << "tensor '" << shown(name) << "': unsupported dtype '" << shown(type) << "' (only F32"
                   << (any_ ? ", F16 and BF16)" : ")");
  }
  e.name = name;
  e.shape = parseShape(name, value["shape"], &e.numel);
  const Json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    Refusal(path_) << "tensor '" << shown(name) << "': data_offsets " << shown(offsets.dump())
                   << " is not a pair of non-negative integers";
  }
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  if (e.end < e.begin) {
    Refusal(path_) << "tensor '" << shown(name) << "': data_offsets " << shown(offsets.dump())
                   << " end before they begin";
  }
  const size_t size = elementBytes(e.dtype);
  if (e.numel > (e.end - e.begin) / size || e.numel * size != e.end - e.begin) {
    Refusal(path_) << "tensor '" << shown(name) << "': shape " << e.shape.str() << " needs " << e.numel
                   << " x " << size << " bytes but data_offsets " << shown(offsets.dump()) << " span "
                   << e.end - e.begin;
  }
  return e;
}

// Moves each tensor's "crc32c.<name>" out of the metadata into its entry.
uint32_t CheckpointReader::parseCrc(const std::string& what, const std::string& text) {
  bool ok = text.size() == 8 && std::all_of(text.begin(), text.end(), [](char c) {
              return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
            });
  if (!ok) Refusal(path_) << what << " is '" << shown(text) << "', not 8 lowercase hex digits";
  return static_cast<uint32_t>(std::stoul(text, nullptr, 16));
}

// Copies each tensor's "crc32c.<name>" into its entry; refuses CRCs of tensors that do not exist.
void CheckpointReader::attachCrcs(std::vector<Entry>& entries, const Metadata& metadata) {
  std::set<std::string> names;
  for (Entry& e : entries) {
    auto it = metadata.find(kCrcPrefix + e.name);
    if (it == metadata.end()) Refusal(path_) << "missing crc32c for tensor '" << shown(e.name) << "'";
    e.crc = parseCrc("crc32c for tensor '" + shown(e.name) + "'", it->second);
    names.insert(e.name);
  }
  const std::string prefix = kCrcPrefix;
  for (auto it = metadata.lower_bound(prefix); it != metadata.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;
    if (names.count(it->first.substr(prefix.size())) == 0) {
      Refusal(path_) << "metadata has " << shown(it->first) << " but no such tensor";
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
    it = isReservedKey(it->first) ? metadata.erase(it) : std::next(it);
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
      Refusal(path_) << "tensor '" << shown(e.name) << "' ("
                     << byteRange(dataStart_ + e.begin, dataStart_ + e.end)
                     << ") runs past the end of the file (" << fileBytes_ << " bytes)";
    }
    if (e.begin < covered) {
      Refusal(path_) << "tensor '" << shown(e.name) << "' ("
                     << byteRange(dataStart_ + e.begin, dataStart_ + e.end) << ") overlaps tensor '"
                     << shown(previous->name) << "' ("
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
  if (e.dtype != Dtype::kF32) {  // 16-bit: read into the second half of the tensor, widened in place
    auto* half = reinterpret_cast<uint16_t*>(t.data()) + e.numel;
    preadAll(half, e.end - e.begin, dataStart_ + e.begin);
    for (uint64_t i = 0; i < e.numel; ++i) t.data()[i] = widen(half[i], e.dtype);
    return t;
  }
  char* dst = reinterpret_cast<char*>(t.data());
  uint32_t crc = 0;
  for (uint64_t done = 0; done < e.end - e.begin;) {
    size_t chunk = static_cast<size_t>(std::min<uint64_t>(e.end - e.begin - done, kReadChunkBytes));
    preadAll(dst + done, chunk, dataStart_ + e.begin + done);
    if (cohort_) crc = crc32c(dst + done, chunk, crc);
    done += chunk;
  }
  if (cohort_ && crc != e.crc) {
    Refusal(path_) << "crc32c mismatch for tensor '" << shown(e.name) << "' ("
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
  if (!sawMetadata && !any_) Refusal(path_) << "not a Cohort checkpoint: header has no \"__metadata__\"";
  if (cohort_) attachCrcs(entries, metadata);
  checkLayout(entries, fileBytes_ - dataStart_);
  if (cohort_) checkHeaderCrc(entries, metadata);

  Checkpoint out;
  out.tensors.reserve(entries.size());
  for (const Entry& e : entries) out.tensors.push_back({e.name, load(e)});
  if (cohort_) {
    metadata = withoutReservedKeys(std::move(metadata));
    if (any_) metadata[kFormatKey] = kCheckpointFormat;  // so that readSafetensors's callers can tell
  }
  out.metadata = std::move(metadata);
  return out;
}

}  // namespace

Checkpoint readCheckpoint(const std::string& path) { return CheckpointReader(path, false).read(); }

Checkpoint readSafetensors(const std::string& path) { return CheckpointReader(path, true).read(); }

}  // namespace cohort::nn
