// DeviceBenchMemory: where `cohort bench allreduce --backend nccl` keeps its buffers (allreduce_bench.h).
//
// The nccl backend reduces device memory, so the benchmark's input and output live on the rank's GPU
// (cuda:<local rank>): from Communicator::allocateBuffer (`--buffers shared`, the default) or from a
// plain cudaMalloc (`--buffers user`); for nccl both are ordinary device memory. A small device
// scratch carries the harness's own all-reduces of host values (per-iteration times, wrong counts).
// The host fills and checks through upload()/download(): synchronous copies on a stream of its own,
// each bounded by the timeout (TimeoutError), so no copy lands in a timed region.
// Ownership: owns the buffers (freed with it, before the communicator that made the shared ones).
// Thread safety: one thread. Only the nccl build has the factory (COHORT_HAVE_NCCL); the interface
// is here in every build so the benchmark names it without preprocessor branches.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "collectives/communicator.h"

namespace cohort::bench {

class DeviceBenchMemory {
 public:
  virtual ~DeviceBenchMemory() = default;
  virtual float* input() = 0;  // == output() in place
  virtual float* output() = 0;
  virtual float* scratch() = 0;  // scratchCount floats
  virtual void upload(float* device, const float* host, size_t count) = 0;
  virtual void download(float* host, const float* device, size_t count) = 0;
};

struct DeviceBenchMemoryOptions {
  int device = 0;  // cuda:<device>
  size_t maxCount = 0;
  size_t scratchCount = 0;
  bool inPlace = false;
  bool fromCommunicator = true;  // --buffers shared: Communicator::allocateBuffer
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

#ifdef COHORT_HAVE_NCCL
std::unique_ptr<DeviceBenchMemory> makeDeviceBenchMemory(collectives::Communicator& comm,
                                                         const DeviceBenchMemoryOptions& options);
#endif

}  // namespace cohort::bench
