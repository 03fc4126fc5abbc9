#include "nn/sharded_checkpoint_format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "runtime/error.h"
#include "runtime/output_file.h"
#include "runtime/printable.h"
#include "runtime/unique_fd.h"

namespace cohort::nn::sharded_detail {

namespace {

using Json = nlohmann::ordered_json;

// Far above any job; keeps a corrupt manifest from asking for billions of files.
constexpr int64_t kMaxWorldSize = 1 << 20;
constexpr size_t kCrcChunkBytes = size_t{8} << 20;

std::string hex8(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

Json encodeLayout(const Layout& layout) {
  Json units = Json::array();
  for (const ShardMap::Unit& u : layout.units) units.push_back(Json::array({u.name, u.numel}));
  return {{"format", kShardedCheckpointFormat},
          {"generation", layout.generation},
          {"world_size", layout.worldSize},
          {"units", std::move(units)},
          {"tensors", layout.tensors}};
}

// Throws the IoError "<path>: <what>" for a manifest or shard file whose JSON is wrong.
[[noreturn]] void refuse(const std::string& path, const std::string& what) {
  COHORT_THROW(IoError) << path << ": " << runtime::printable(what, 300);
}

Layout decodeLayout(const std::string& path, const Json& j) {
  if (j.at("format").get<std::string>() != kShardedCheckpointFormat) {
    refuse(path, "sharded checkpoint format '" + j.at("format").get<std::string>() + "', expected " +
                     kShardedCheckpointFormat);
  }
  Layout layout;
  layout.generation = j.at("generation").get<uint64_t>();
  const int64_t worldSize = j.at("world_size").get<int64_t>();
  if (worldSize < 1 || worldSize > kMaxWorldSize) refuse(path, "world size " + std::to_string(worldSize) + " is absurd");
  layout.worldSize = static_cast<int>(worldSize);
  for (const Json& u : j.at("units")) {
    if (!u.is_array() || u.size() != 2) refuse(path, "a unit is not [name, numel]: " + u.dump());
    layout.units.push_back({u.at(0).get<std::string>(), u.at(1).get<size_t>()});
  }
  try {
    ShardMap check(layout.units, {.worldSize = layout.worldSize, .rank = 0});
  } catch (const InvalidArgument& e) {
    refuse(path, std::string("its units make no shard map: ") + e.what());
  }
  std::set<std::string> names;
  for (const Json& t : j.at("tensors")) {
    layout.tensors.push_back(t.get<std::string>());
    if (layout.tensors.back().empty() || !names.insert(layout.tensors.back()).second) {
      refuse(path, "tensor name '" + layout.tensors.back() + "' is empty or repeated");
    }
  }
  return layout;
}

// Parses `json` and hands it to `decode`, turning nlohmann's errors into one-line IoErrors.
template <class F>
auto parsed(const std::string& path, const std::string& json, F decode) {
  try {
    return decode(Json::parse(json));
  } catch (const nlohmann::json::exception& e) {
    refuse(path, std::string("sharded checkpoint record is malformed: ") + e.what());
  }
}

uint32_t parseCrc(const std::string& path, const std::string& text) {
  unsigned value = 0;
  int used = 0;
  if (text.size() != 8 || std::sscanf(text.c_str(), "%8x%n", &value, &used) != 1 || used != 8) {
    refuse(path, "CRC '" + text + "' is not 8 hex digits");
  }
  return value;
}

}  // namespace

std::vector<ShardMap::Unit> unitsOf(const ShardMap& map) {
  std::vector<ShardMap::Unit> units;
  for (size_t u = 0; u < map.units(); ++u) units.push_back(map.unit(u));
  return units;
}

bool sameUnits(const std::vector<ShardMap::Unit>& a, const std::vector<ShardMap::Unit>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const ShardMap::Unit& x, const ShardMap::Unit& y) {
    return x.name == y.name && x.numel == y.numel;
  });
}

std::string encodeManifest(const Layout& layout, const std::vector<ShardFile>& files) {
  Json j = encodeLayout(layout);
  Json list = Json::array();
  for (const ShardFile& f : files) {
    list.push_back({{"name", runtime::splitOutputPath(f.path).second}, {"bytes", f.bytes}, {"crc32c", hex8(f.crc32c)}});
  }
  j["files"] = std::move(list);
  return j.dump();
}

ShardedManifest decodeManifest(const std::string& path, const std::string& json) {
  return parsed(path, json, [&](const Json& j) {
    const Layout layout = decodeLayout(path, j);
    ShardedManifest m{.generation = layout.generation,
                      .worldSize = layout.worldSize,
                      .units = layout.units,
                      .tensors = layout.tensors};
    const Json& files = j.at("files");
    if (files.size() != static_cast<size_t>(layout.worldSize)) {
      refuse(path, "names " + std::to_string(files.size()) + " shard files for world size " +
                       std::to_string(layout.worldSize));
    }
    for (int r = 0; r < layout.worldSize; ++r) {
      const Json& f = files.at(static_cast<size_t>(r));
      const std::string expected = shardFilePath(path, layout.generation, r, layout.worldSize);
      const std::string name = f.at("name").get<std::string>();
      if (name != runtime::splitOutputPath(expected).second) {
        refuse(path, "rank " + std::to_string(r) + "'s shard file is named '" + name + "', expected " + expected);
      }
      m.files.push_back({expected, f.at("bytes").get<uint64_t>(), parseCrc(path, f.at("crc32c").get<std::string>())});
    }
    return m;
  });
}

std::string encodeShardHeader(const Layout& layout, int rank) {
  Json j = encodeLayout(layout);
  j["rank"] = rank;
  return j.dump();
}

Layout decodeShardHeader(const std::string& path, const std::string& json, int* rank) {
  return parsed(path, json, [&](const Json& j) {
    Layout layout = decodeLayout(path, j);
    *rank = j.at("rank").get<int>();
    return layout;
  });
}

ShardFile measureFile(const std::string& path) {
  runtime::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) COHORT_THROW(IoError) << path << ": cannot open shard file: " << std::strerror(errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) COHORT_THROW(IoError) << path << ": cannot stat: " << std::strerror(errno);
  if (!S_ISREG(st.st_mode)) COHORT_THROW(IoError) << path << ": not a regular file";
  ShardFile file{.path = path, .bytes = static_cast<uint64_t>(st.st_size)};
  std::vector<char> chunk(std::min<uint64_t>(kCrcChunkBytes, file.bytes));
  for (uint64_t at = 0; at < file.bytes; at += chunk.size()) {
    const size_t n = std::min<uint64_t>(chunk.size(), file.bytes - at);
    runtime::readFullyAt(fd.get(), chunk.data(), n, at, path);
    file.crc32c = crc32c(chunk.data(), n, file.crc32c);
  }
  return file;
}

void checkCallerMetadata(const std::string& path, const Metadata& metadata) {
  for (const char* key : {kShardedCheckpointKey, kShardFileKey}) {
    if (metadata.count(key)) COHORT_THROW(InvalidArgument) << path << ": metadata key '" << key << "' is reserved";
  }
}

}  // namespace cohort::nn::sharded_detail
