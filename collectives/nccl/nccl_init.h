// Creating one rank's NCCL communicator, and the NCCL error handling the backend shares
// (nccl_communicator.h describes the backend).
//
// initNccl() does the set-up in this order, every step bounded by options.timeout:
//   0. NCCL itself is loaded (nccl_library.h; IoError when it cannot be);
//   1. the device: cuda:<local rank>, refused when this process sees too few devices
//      (gpu_assignment.h) or when options.computeStream lives on another device;
//   2. the node rendezvous (node_rendezvous.h): every local rank publishes its GPU's PCI bus id,
//      two local ranks on one GPU are refused (the same InvalidArgument on every local rank), and on
//      a one-node job local rank 0 publishes the NCCL unique id;
//   3. across nodes, the unique id from global rank 0 through an MpiStore (collective over
//      MPI_COMM_WORLD, so the job must run under mpirun);
//   4. ncclCommInitRankConfig with blocking = 0, then ncclCommGetAsyncError polled until the
//      communicator is ready; at the deadline ncclCommAbort and a TimeoutError.
// Collective: every rank of the world calls it. Leaves the calling thread's current device as it was.
// Only built with CUDA and NCCL.
#pragma once

#include <nccl.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "collectives/communicator.h"
#include "collectives/nccl/nccl_library.h"

namespace cohort::collectives::nccl {

struct NcclSetup {
  std::shared_ptr<const NcclLibrary> nccl;  // comm's functions
  ncclComm_t comm = nullptr;                // ready for collectives; the caller owns it
  int device = 0;                           // cuda:<device>
};

NcclSetup initNccl(const CommunicatorOptions& options);

// "unhandled system error (Connection refused)": the result's text and NCCL's last message.
std::string ncclMessage(const NcclLibrary& nccl, ncclResult_t result, ncclComm_t comm);

// Throws for a failed NCCL call `what` on `rank`: InvalidArgument for invalid arguments or usage,
// PeerError for system and remote errors (a peer or the network failed), cohort::Error otherwise.
[[noreturn]] void throwNccl(const NcclLibrary& nccl, ncclResult_t result, const std::string& what, int rank,
                            ncclComm_t comm);

// Polls ncclCommGetAsyncError while it reports ncclInProgress (a non-blocking communicator still
// working on the last call). Returns the final state, or nullopt at the deadline.
std::optional<ncclResult_t> pollWhileInProgress(const NcclLibrary& nccl, ncclComm_t comm,
                                                std::chrono::steady_clock::time_point deadline);

}  // namespace cohort::collectives::nccl
