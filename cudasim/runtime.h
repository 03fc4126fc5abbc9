// What the parts of cudasim's CUDA runtime share: private to cudasim.
//
// The runtime is three files: runtime.cc (the configuration, the registry of everything live, the
// thread's current device and last error, devices and their properties, error names), memory.cc
// (device and pinned memory, copies and sets, IPC handles) and streams.cc (streams, events, kernel
// launches). What one of them needs of another is declared here.
// Thread safety: the registry's containers are guarded by Registry::m; a stream's and an event's
// fields by their own mutex; tlsDevice and tlsLastError are the calling thread's.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "cuda_runtime.h"

struct CUstream_st {
  int device = 0;
  unsigned flags = 0;
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  uint64_t enqueued = 0, done = 0;
  bool stopping = false;
  std::mt19937_64 rng;
};

struct CUevent_st {
  unsigned flags = 0;
  std::mutex m;
  std::condition_variable cv;
  uint64_t recorded = 0, completed = 0;
  std::chrono::steady_clock::time_point time;
};

namespace cudasim {

constexpr int kMaxDevices = 16;

struct Config {
  int devices = 2;
  size_t memoryBytes = size_t{2048} << 20;
  bool peer = true;
  unsigned delayUs = 200;
  uint64_t seed = 0;
  std::vector<int> visible;  // visible index -> emulated GPU
};

// The configuration (include/cudasim/sim.h), read from the environment once per process.
const Config& config();
int deviceCount();

extern thread_local cudaError_t tlsLastError;
extern thread_local int tlsDevice;

// Sets the calling thread's last error to `e` and returns it.
cudaError_t fail(cudaError_t e);

struct Allocation {
  char* mapping = nullptr;  // kGuard + bytes + kGuard (memory.cc)
  size_t bytes = 0;
  int device = 0;
  int fd = -1;              // the memfd (owner); -1 for an imported mapping
  ino_t inode = 0;
  bool imported = false;
};

struct Registry {
  std::mutex m;
  std::map<uintptr_t, Allocation> device;  // by the pointer handed out
  std::map<uintptr_t, size_t> pinned;
  std::set<CUstream_st*> streams;
  std::set<CUevent_st*> events;
  CUstream_st* defaults[kMaxDevices] = {};
  size_t used[kMaxDevices] = {};
  std::deque<std::pair<char*, size_t>> quarantine;  // freed mappings, inaccessible, oldest first
  size_t quarantined = 0;
};

// The process's registry (a fresh one in a forked child).
Registry& registry();

// From streams.cc.
// The stream an API call names: the current device's default stream for nullptr, or nullptr when
// `stream` is not a live stream.
CUstream_st* resolve(cudaStream_t stream);
// An op of a capturing stream goes into its capture instead (graph.cc); its ticket is then 0.
uint64_t push(CUstream_st* s, std::function<void()> op);
// Waits until the op with `ticket` (from push) has run.
void waitFor(CUstream_st* s, uint64_t ticket);
// Waits until everything enqueued on `s` so far has run.
void synchronizeStream(CUstream_st* s);
// The live streams of `device`, its default stream among them once it exists.
std::vector<CUstream_st*> streamsOf(int device);

}  // namespace cudasim
