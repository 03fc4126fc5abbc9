#include "collectives/communicator.h"

#include "collectives/mpi/mpi_communicator.h"
#include "collectives/shm/shm_communicator.h"
#include "runtime/error.h"

namespace cohort::collectives {

std::vector<std::string> availableBackends() { return {"shm", "mpi"}; }

std::string resolveBackend(const CommunicatorOptions& options) {
  std::string backend = options.backend;
  if (backend.empty()) backend = options.world.spansNodes() ? "mpi" : "shm";
  if (backend == "shm" && options.world.spansNodes()) {
    COHORT_THROW(InvalidArgument) << "the shm backend works on one node, but this job has " << options.world.worldSize
                                  << " ranks with " << options.world.localWorldSize << " on this node: use --backend mpi";
  }
  if (backend == "nccl") {
    COHORT_THROW(InvalidArgument) << "the nccl backend (GPU) is not available in this version yet; use shm or mpi";
  }
  if (backend != "shm" && backend != "mpi") {
    COHORT_THROW(InvalidArgument) << "unknown backend '" << backend << "': expected shm or mpi";
  }
  return backend;
}

std::unique_ptr<Communicator> makeCommunicator(const CommunicatorOptions& options) {
  const std::string backend = resolveBackend(options);
  if (backend == "shm") return makeShmCommunicator(options);
  return makeMpiCommunicator(options);
}

}  // namespace cohort::collectives
