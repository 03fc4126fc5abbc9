// NodeRendezvous: how the local ranks of one node meet before the nccl backend starts NCCL (no CUDA
// here: the caller brings its GPU's bus id and, on local rank 0, the NCCL unique id, so this runs in
// tests on any machine).
//
// Local rank 0 creates the job segment segmentName(jobId, "nccl") (ipc::ShmRegion, generation = the
// job's restart count) holding a header {magic, local world size, unique id if any, closed} and one
// slot per local rank, fills the header and its own slot, and publishes it. Every other local rank
// opens it (waiting up to the timeout), checks the header, and fills its slot {rank, device index,
// bus id, pid}, marking it ready last (release). Every rank then waits until all slots are ready.
// Local rank 0 removes the segment's name and sets `closed`; the others return only once they see
// `closed`. So the name is gone before any rank can start a second rendezvous, and a rank can never
// mistake the previous communicator's segment for the next one's; a crash leaves no name behind
// either (the creator's region unlinks on destruction). A node with one local rank needs no segment:
// the call returns at once (single processes all have the job id "local" and must not collide).
// Errors: TimeoutError naming the local ranks that did not arrive (or local rank 0 when the segment
// never appears), PeerError when local rank 0 exits before closing, IoError for a segment that is not
// ours, InvalidArgument for a local world size that differs between ranks.
// Ownership: nothing outlives the call; the result is plain values.
// Collective over the node's local ranks: each calls rendezvousOnNode once per communicator, in the
// same order. Thread safety: one call per thread at a time (separate calls may run concurrently in
// different processes, or in threads of one test process).
//
//   auto met = rendezvousOnNode({.jobId = world.jobId, .rank = world.rank, .localRank = world.localRank,
//                                .localWorldSize = world.localWorldSize, .timeout = 60s},
//                               {.deviceIndex = k, .busId = busId}, makeIdOnLocalRank0);
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "collectives/nccl/gpu_assignment.h"

namespace cohort::collectives::nccl {

inline constexpr size_t kUniqueIdBytes = 128;  // sizeof(ncclUniqueId) (NCCL_UNIQUE_ID_BYTES)
using UniqueIdBytes = std::array<uint8_t, kUniqueIdBytes>;

struct NodeRendezvousOptions {
  std::string jobId;
  int rank = 0;
  int localRank = 0;
  int localWorldSize = 1;
  uint64_t generation = 0;  // the job's restart count
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  std::string name = "nccl";
};

struct MyGpu {
  int deviceIndex = 0;
  std::string busId;  // at most 63 characters
};

struct NodeRendezvousResult {
  std::vector<RankGpu> gpus;              // by local rank
  std::optional<UniqueIdBytes> uniqueId;  // set when local rank 0 passed makeUniqueId
};

// `makeUniqueId` is called on local rank 0 only, before the segment is published; pass an empty
// function when the unique id travels another way (a job that spans nodes).
NodeRendezvousResult rendezvousOnNode(const NodeRendezvousOptions& options, const MyGpu& mine,
                                      const std::function<UniqueIdBytes()>& makeUniqueId);

}  // namespace cohort::collectives::nccl
