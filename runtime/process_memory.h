// ProcessMemory: how much of this process is resident in RAM, and what kind of memory it is, from
// /proc/self/status (Linux). `cohort train --memory-report` prints it on the CPU; it is the figure
// behind the per-worker budget of docs/build.md ("What a CPU worker costs").
//
// resident = anonymous + file-backed + shared memory:
//   - anonymous: heap, thread stacks, the libraries' relocated data: private to this process, so
//     what every additional worker adds to the node;
//   - file-backed: the pages of the program and its shared libraries that were touched; the page
//     cache holds one copy for every process that maps the same file;
//   - shared memory: /dev/shm segments this process has touched (Hogwild's parameters, the shm
//     backend's buffers), counted again in every process that maps them.
// peakResident is the most this process ever had resident (VmHWM; getrusage's ru_maxrss).
// Thread safety: processMemory() may be called from any thread; it reads one file.
//
//   runtime::ProcessMemory m = runtime::processMemory();
//   std::cout << m.peakResidentBytes << " bytes at the peak, " << m.anonymousBytes << " private now\n";
#pragma once

#include <cstddef>
#include <string>

namespace cohort::runtime {

struct ProcessMemory {
  size_t peakResidentBytes = 0;  // VmHWM
  size_t residentBytes = 0;      // VmRSS
  size_t anonymousBytes = 0;     // RssAnon
  size_t fileBytes = 0;          // RssFile
  size_t sharedMemoryBytes = 0;  // RssShmem
};

// This process, now. Throws IoError when /proc/self/status cannot be read or lacks a figure.
ProcessMemory processMemory();

// The figures of a /proc/<pid>/status text ("VmHWM:\t  15932 kB" lines). Throws IoError naming
// `source` and the first missing field.
ProcessMemory parseProcStatus(const std::string& text, const std::string& source);

// MemoryHeadroom: how much more memory this process can take before the kernel's OOM killer comes:
// the least of the host's MemAvailable and, for every cgroup memory limit that applies to this
// process, that limit less the cgroup's usage. A container's or a SLURM job's limit is such a
// cgroup limit, and it is usually far below the host's MemAvailable (issue 44, item 16: a 6.2 GiB
// run passed a check against MemAvailable in a 3 GiB cgroup and was OOM-killed without a word).
//
// The cgroups are this process's, from /proc/self/cgroup: cgroup v2 ("0::/path") under the cgroup
// root and its "unified" directory (a hybrid system), memory.max ("max": no limit) less
// memory.current; cgroup v1's memory controller ("N:memory:/path", or among other controllers) under
// "<root>/memory", memory.limit_in_bytes (2^62 or more: no limit) less memory.usage_in_bytes. Each
// from the cgroup's directory up to the hierarchy's root, since every ancestor's limit applies too
// (a container sees its own cgroup as the root, so a path that does not exist there is skipped).
// Files that are missing or unreadable are skipped: no limit is known from them.
// Thread safety: memoryHeadroom() may be called from any thread; it only reads files.
//
//   runtime::MemoryHeadroom h = runtime::memoryHeadroom();
//   if (need > h.availableBytes) std::cerr << "needs more than " << h.describe() << " leaves\n";
struct MemoryHeadroomOptions {
  std::string procRoot = "/proc";             // <procRoot>/meminfo and <procRoot>/self/cgroup
  std::string cgroupRoot = "/sys/fs/cgroup";  // where the cgroup hierarchies are mounted
};

struct MemoryHeadroom {
  size_t availableBytes = 0;      // the least of the figures below (when known())
  size_t hostAvailableBytes = 0;  // MemAvailable of /proc/meminfo; 0: unknown
  // The cgroup whose limit leaves the least, when it leaves less than MemAvailable; else empty.
  std::string cgroupPath;  // its directory, e.g. "/sys/fs/cgroup/x"
  size_t cgroupLimitBytes = 0;
  size_t cgroupUsageBytes = 0;

  // Whether any figure is known (MemAvailable, or a cgroup limit).
  bool known() const { return hostAvailableBytes > 0 || !cgroupPath.empty(); }
  // "the cgroup limit of /sys/fs/cgroup/x: 3.0 GiB, 0.2 GiB in use" or "the host's MemAvailable: 22.3 GiB".
  std::string describe() const;
};

MemoryHeadroom memoryHeadroom(const MemoryHeadroomOptions& options = {});

}  // namespace cohort::runtime
