// ProcessMemory (runtime/process_memory.h): the resident figures of /proc/self/status.
#include "runtime/process_memory.h"

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "runtime/error.h"

namespace cohort::runtime {
namespace {

// The value of the "<name>:  <n> kB" line in bytes, or throws naming the field.
size_t field(const std::string& text, const std::string& name, const std::string& source) {
  const std::string key = name + ":";
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.compare(0, key.size(), key) != 0) continue;
    std::istringstream value(line.substr(key.size()));
    size_t kib = 0;
    std::string unit;
    if (!(value >> kib >> unit) || unit != "kB") {
      COHORT_THROW(IoError) << source << ": cannot read its " << name << " line '" << line << "' (expected '<n> kB')";
    }
    return kib * 1024;
  }
  COHORT_THROW(IoError) << source << ": no " << name << " line";
}

// A small file's text, or nothing when it cannot be read.
std::optional<std::string> readText(const std::string& path) {
  std::ifstream in(path);
  if (!in.is_open()) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return text.str();
}

// A file holding one number of bytes; nothing for "max", an unreadable file or other text.
std::optional<size_t> readBytes(const std::string& path) {
  const std::optional<std::string> text = readText(path);
  if (!text) return std::nullopt;
  std::istringstream in(*text);
  unsigned long long value = 0;
  if (!(in >> value)) return std::nullopt;  // "max", or not a number
  return static_cast<size_t>(value);
}

// v1 writes "no limit" as the largest page-aligned counter (9223372036854771712 with 4 KiB pages).
constexpr size_t kUnlimitedV1 = size_t{1} << 62;

struct CgroupFiles {
  std::string directory;  // the hierarchy's mount point plus this process's cgroup path
  std::string root;       // the hierarchy's mount point: the walk stops there
  const char* limit;      // memory.max or memory.limit_in_bytes
  const char* usage;      // memory.current or memory.usage_in_bytes
};

// The cgroup directories whose memory limits apply to this process, innermost first per hierarchy.
std::vector<CgroupFiles> memoryCgroups(const MemoryHeadroomOptions& o) {
  std::vector<CgroupFiles> found;
  const std::optional<std::string> text = readText(o.procRoot + "/self/cgroup");
  if (!text) return found;
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string id = line.substr(0, first), controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1) == "/" ? "" : line.substr(second + 1);
    if (id == "0" && controllers.empty()) {
      for (const std::string& root : {o.cgroupRoot, o.cgroupRoot + "/unified"}) {
        found.push_back({root + path, root, "memory.max", "memory.current"});
      }
      continue;
    }
    std::istringstream names(controllers);
    for (std::string name; std::getline(names, name, ',');) {
      if (name == "memory")
        found.push_back({o.cgroupRoot + "/memory" + path, o.cgroupRoot + "/memory", "memory.limit_in_bytes",
                         "memory.usage_in_bytes"});
    }
  }
  return found;
}

// The parent directory of `dir` ("/a/b" -> "/a").
std::string parentOf(const std::string& dir) { return dir.substr(0, dir.find_last_of('/')); }

std::string gib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / double(size_t{1} << 30));
  return text;
}

}  // namespace

std::string MemoryHeadroom::describe() const {
  if (!cgroupPath.empty()) {
    return "the cgroup limit of " + cgroupPath + ": " + gib(cgroupLimitBytes) + ", " + gib(cgroupUsageBytes) +
           " in use";
  }
  return "the host's MemAvailable: " + gib(hostAvailableBytes);
}

MemoryHeadroom memoryHeadroom(const MemoryHeadroomOptions& options) {
  MemoryHeadroom h;
  if (const std::optional<std::string> meminfo = readText(options.procRoot + "/meminfo")) {
    try {
      h.hostAvailableBytes = field(*meminfo, "MemAvailable", options.procRoot + "/meminfo");
    } catch (const IoError&) {
      // An old kernel without MemAvailable: the cgroups alone bound it.
    }
  }
  h.availableBytes = h.hostAvailableBytes;
  for (const CgroupFiles& c : memoryCgroups(options)) {
    for (std::string dir = c.directory; dir.size() >= c.root.size(); dir = parentOf(dir)) {
      const std::optional<size_t> limit = readBytes(dir + "/" + c.limit);
      if (limit && *limit < kUnlimitedV1) {
        const size_t usage = readBytes(dir + "/" + c.usage).value_or(0);
        const size_t left = *limit > usage ? *limit - usage : 0;
        if (!h.known() || left < h.availableBytes) {
          h.availableBytes = left;
          h.cgroupPath = dir;
          h.cgroupLimitBytes = *limit;
          h.cgroupUsageBytes = usage;
        }
      }
      if (dir == c.root) break;
    }
  }
  return h;
}

ProcessMemory parseProcStatus(const std::string& text, const std::string& source) {
  return {.peakResidentBytes = field(text, "VmHWM", source),
          .residentBytes = field(text, "VmRSS", source),
          .anonymousBytes = field(text, "RssAnon", source),
          .fileBytes = field(text, "RssFile", source),
          .sharedMemoryBytes = field(text, "RssShmem", source)};
}

ProcessMemory processMemory() {
  const std::string path = "/proc/self/status";
  const std::optional<std::string> text = readText(path);
  if (!text) COHORT_THROW(IoError) << path << ": cannot open it";
  return parseProcStatus(*text, path);
}

}  // namespace cohort::runtime
