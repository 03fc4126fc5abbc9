// cudasim's own interface, beside the CUDA API it emulates: for its runtime, its SIMT scheduler and
// the emulated libraries (cuBLAS, cuDNN, NCCL), which run their work as operations of a stream.
//
// Configuration (environment, read once per process):
//   COHORT_CUDASIM_DEVICES   emulated GPUs (default 2)
//   COHORT_CUDASIM_MEMORY_MB memory per GPU (default 2048)
//   COHORT_CUDASIM_PEER      1 (default): GPUs can access each other's memory; 0: they cannot
//   COHORT_CUDASIM_DELAY_US  each stream operation starts after a random delay of up to this many
//                            microseconds (default 200; 0: none), so work on two streams interleaves
//                            differently run after run and a missing event wait shows
//   COHORT_CUDASIM_SEED      seeds the delays and the thread and block orders (default: from the pid)
//   COHORT_CUDASIM_NCCL_DIR  the directory of the emulated NCCL's segments (default: COHORT_SHM_DIR,
//                            else /dev/shm): one for every rank where a test plays several nodes
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "cuda_runtime.h"

namespace cudasim {

// Runs every thread of the grid (simt.cc), blocks and threads shuffled by `seed`.
void runGrid(const LaunchConfig& config, const std::function<void()>& body, uint64_t seed);

// Enqueues `op` on `stream` (nullptr: the current device's default stream): it runs on the
// stream's thread after everything enqueued there before. cudaErrorInvalidResourceHandle for a
// destroyed or unknown stream.
cudaError_t enqueue(cudaStream_t stream, std::function<void()> op);

// Whether [p, p + bytes) lies inside one live device allocation (or an opened IPC mapping).
bool isDeviceRange(const void* p, size_t bytes);

// Aborts, naming `what`, unless every one of the 32 lanes of the running thread's warp exists and
// has not ended (the warp-collective instructions of cudasim/ptx.h need the whole warp).
void requireWholeWarp(const char* what);

// A fresh seed for the next randomised decision (delays, orders).
uint64_t nextSeed();

}  // namespace cudasim
