#include "nn/checkpoint.h"

#include <fcntl.h>
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
#include "runtime/output_file.h"
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

void writeFileAtomically(const std::string& path, const std::vector<std::span<const std::byte>>& parts,
                         runtime::OutputMode mode) {
  runtime::OutputFile out(path, {.mode = mode});
  for (std::span<const std::byte> part : parts) out.write(part.data(), part.size());
  out.commit();
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
  // A checkpoint is the state a resume loads: only its user reads it. Exports are the user's to share.
  writeFileAtomically(path, parts, cohort ? runtime::OutputMode::kPrivate : runtime::OutputMode::kUserVisible);
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
  const auto [dir, base] = runtime::splitOutputPath(path);
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    Refusal(path) << "is a directory; " << what << " need a file name (e.g. " << path << "/" << (what == "checkpoints" ? "run.st" : "out") << ")";
  }
  if (::stat(dir.c_str(), &st) != 0) refuseWithErrno(path, "cannot write " + what + " into directory " + dir);
  if (!S_ISDIR(st.st_mode)) Refusal(path) << "cannot write " << what << " into " << dir << ": not a directory";
  // The proof that a writer will be able to create its file: create a temporary as a writer does
  // (an unpredictable name, exclusively) and let it go uncommitted, which removes it.
  runtime::OutputFile probe(path);
}

size_t prepareCheckpointDestination(const std::string& path) {
  const size_t removed = runtime::removeStaleTemporaries(path);  // before the probe, which sweeps too
  checkOutputFile(path, "checkpoints");
  return removed;
}

const runtime::Tensor* Checkpoint::find(const std::string& name) const {
  for (const NamedTensor& t : tensors) {
    if (t.name == name) return &t.tensor;
  }
  return nullptr;
}

}  // namespace cohort::nn
