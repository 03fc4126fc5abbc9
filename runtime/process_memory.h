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

}  // namespace cohort::runtime
