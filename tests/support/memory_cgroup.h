// ScopedMemoryCgroup: a memory cgroup of a test's own, made inside this process's memory cgroup
// (cgroup v1's memory controller, or v2's where this process's cgroup delegates it) with a limit, and
// removed when the object goes: the processes put in it should have exited; any left are moved back
// to the parent first. Needs root and a writable hierarchy, and runs outside Bazel's sandbox only
// (tags no-sandbox: the sandbox mounts /sys/fs/cgroup read-only). Where it cannot be made, reason()
// says why, and the test skips with it (GTEST_SKIP, which scripts/test counts and prints).
// Thread safety: none needed (one test at a time per process).
//
//   ScopedMemoryCgroup cgroup("cohort-mytest-" + std::to_string(::getpid()), size_t{512} << 20);
//   if (!cgroup.reason().empty()) GTEST_SKIP() << cgroup.reason();
//   runCommand({"/bin/sh", "-c", "echo $$ > \"$0\" && exec \"$@\"", cgroup.procsFile(), program, ...});
//   cgroup.peakBytes();  // the most the processes in it held at once
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace cohort::testing {

// This process's memory cgroup directory and the names of its files there, or an empty directory.
struct OwnMemoryCgroup {
  std::string directory;
  std::string limitFile;  // memory.limit_in_bytes (v1) or memory.max (v2)
  std::string peakFile;   // memory.max_usage_in_bytes (v1) or memory.peak (v2)
};

inline OwnMemoryCgroup ownMemoryCgroup() {
  std::ifstream in("/proc/self/cgroup");
  OwnMemoryCgroup v2;
  for (std::string line; std::getline(in, line);) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1), path = line.substr(second + 1);
    if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      return {"/sys/fs/cgroup/memory" + path, "memory.limit_in_bytes", "memory.max_usage_in_bytes"};
    }
    if (line.rfind("0::", 0) == 0) v2 = {"/sys/fs/cgroup" + (path == "/" ? "" : path), "memory.max", "memory.peak"};
  }
  return v2;
}

// Whether all of `text` was written to the existing file `path`.
inline bool writeCgroupFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  return ::close(fd) == 0 && ok;
}

class ScopedMemoryCgroup {
 public:
  ScopedMemoryCgroup(const std::string& name, size_t limitBytes) {
    if (::geteuid() != 0) {
      reason_ = "making a cgroup needs root";
      return;
    }
    own_ = ownMemoryCgroup();
    if (own_.directory.empty()) {
      reason_ = "no memory cgroup in /proc/self/cgroup";
      return;
    }
    directory_ = own_.directory + "/" + name;
    if (::mkdir(directory_.c_str(), 0700) != 0) {
      reason_ = "cannot make " + directory_ + ": " + std::strerror(errno);
      directory_.clear();
      return;
    }
    if (!writeCgroupFile(directory_ + "/" + own_.limitFile, std::to_string(limitBytes))) {
      reason_ = "cannot limit " + directory_ + " (" + own_.limitFile + "; the memory controller is not enabled "
                "there?): " + std::strerror(errno);
    }
  }
  ~ScopedMemoryCgroup() {
    if (directory_.empty()) return;
    std::ifstream procs(procsFile());
    for (std::string pid; std::getline(procs, pid);) writeCgroupFile(own_.directory + "/cgroup.procs", pid);
    if (::rmdir(directory_.c_str()) != 0) {
      std::fprintf(stderr, "could not remove the cgroup %s: %s\n", directory_.c_str(), std::strerror(errno));
    }
  }
  ScopedMemoryCgroup(const ScopedMemoryCgroup&) = delete;
  ScopedMemoryCgroup& operator=(const ScopedMemoryCgroup&) = delete;

  // Why the cgroup could not be made and limited; empty when it was.
  const std::string& reason() const { return reason_; }
  const std::string& directory() const { return directory_; }
  // Where a process writes its pid to move into the cgroup.
  std::string procsFile() const { return directory_ + "/cgroup.procs"; }
  // The most memory the cgroup's processes held at once (v2: memory.peak, Linux 5.19 and later).
  std::optional<size_t> peakBytes() const {
    std::ifstream in(directory_ + "/" + own_.peakFile);
    unsigned long long bytes = 0;
    if (!(in >> bytes)) return std::nullopt;
    return static_cast<size_t>(bytes);
  }

 private:
  OwnMemoryCgroup own_;
  std::string directory_, reason_;
};

}  // namespace cohort::testing
