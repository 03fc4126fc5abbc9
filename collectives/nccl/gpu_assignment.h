// Which GPU each rank of the nccl backend uses, and the two checks on that choice (no CUDA here, so
// they are unit-tested on any machine).
//
// The nccl backend runs local rank k on cuda:k (the k-th device this process sees). Two mistakes
// are refused before NCCL starts, with an InvalidArgument (exit code 2) that says how to fix them:
//   - local rank k when the process sees k devices or fewer (more ranks per node than GPUs, or a
//     CUDA_VISIBLE_DEVICES that hides them);
//   - two local ranks on one physical GPU (identified by its PCI bus id, which every local rank
//     publishes at the node rendezvous, nccl_rendezvous.h): NCCL does not support two ranks of one
//     communicator on the same device and may hang. This happens when ranks see different
//     CUDA_VISIBLE_DEVICES, e.g. "1,0" on local rank 0 and "0,1" on local rank 1.
// Both functions are pure: every rank runs the duplicate check on the same table and throws the same
// message. Thread safety: stateless.
//
//   checkDeviceForLocalRank(world.localRank, deviceCount, std::getenv("CUDA_VISIBLE_DEVICES"));
//   checkDistinctGpus(rendezvous.gpus);
#pragma once

#include <string>
#include <vector>

namespace cohort::collectives::nccl {

// One local rank's GPU, as published at the rendezvous.
struct RankGpu {
  int rank = 0;  // global rank
  int localRank = 0;
  int deviceIndex = 0;  // cuda:<deviceIndex> in that rank's process
  std::string busId;    // cudaDeviceGetPCIBusId, e.g. "0000:3B:00.0"
};

// The device index local rank `localRank` uses: localRank itself. Throws InvalidArgument when the
// process sees no more than `localRank` devices. `cudaVisibleDevices` is the variable's value, or
// nullptr when it is unset (only for the message).
int checkDeviceForLocalRank(int localRank, int visibleDeviceCount, const char* cudaVisibleDevices);

// Throws InvalidArgument naming the first two local ranks (in local rank order) that share a bus id,
// both device indices and the GPU. Bus ids compare case-insensitively ("3b" == "3B").
void checkDistinctGpus(const std::vector<RankGpu>& gpus);

}  // namespace cohort::collectives::nccl
