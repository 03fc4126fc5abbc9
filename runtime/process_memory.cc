// ProcessMemory (runtime/process_memory.h): the resident figures of /proc/self/status.
#include "runtime/process_memory.h"

#include <fstream>
#include <sstream>

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

}  // namespace

ProcessMemory parseProcStatus(const std::string& text, const std::string& source) {
  return {.peakResidentBytes = field(text, "VmHWM", source),
          .residentBytes = field(text, "VmRSS", source),
          .anonymousBytes = field(text, "RssAnon", source),
          .fileBytes = field(text, "RssFile", source),
          .sharedMemoryBytes = field(text, "RssShmem", source)};
}

ProcessMemory processMemory() {
  const std::string path = "/proc/self/status";
  std::ifstream in(path);
  if (!in.is_open()) COHORT_THROW(IoError) << path << ": cannot open it";
  std::ostringstream text;
  text << in.rdbuf();
  return parseProcStatus(text.str(), path);
}

}  // namespace cohort::runtime
