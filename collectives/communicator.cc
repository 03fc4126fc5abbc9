#include "collectives/communicator.h"

#include <algorithm>
#include <sstream>

#include "collectives/hierarchical/hierarchical_communicator.h"
#include "collectives/mpi/mpi_communicator.h"
#include "collectives/mpi/mpi_environment.h"
#include "collectives/shm/shm_communicator.h"
#include "runtime/error.h"

#ifdef COHORT_HAVE_NCCL
#include "collectives/nccl/nccl_communicator.h"
#endif

namespace cohort::collectives {
namespace {

// "shm, mpi and nccl"
std::string listed(const std::vector<std::string>& names) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) os << (i + 1 == names.size() ? " and " : ", ");
    os << names[i];
  }
  return os.str();
}

}  // namespace

std::vector<std::string> availableBackends() {
#ifdef COHORT_HAVE_NCCL
  return {"shm", "mpi", "hierarchical", "nccl"};
#else
  return {"shm", "mpi", "hierarchical"};
#endif
}

std::string resolveBackend(const CommunicatorOptions& options) {
  std::string backend = options.backend;
  if (backend.empty()) backend = options.world.spansNodes() ? "hierarchical" : "shm";
  const std::vector<std::string> available = availableBackends();
  if (std::find(available.begin(), available.end(), backend) == available.end()) {
    if (backend == "nccl") {
      COHORT_THROW(InvalidArgument) << "the nccl backend (GPU) is not in this build: it needs CUDA and NCCL when "
                                    << "Cohort is built (see docs/collectives.md); this build has "
                                    << listed(available);
    }
    COHORT_THROW(InvalidArgument) << "unknown backend '" << backend << "': this build has " << listed(available);
  }
  if (backend == "shm" && options.world.spansNodes()) {
    COHORT_THROW(InvalidArgument) << "the shm backend works on one node, but this job has " << options.world.worldSize
                                  << " ranks with " << options.world.localWorldSize
                                  << " on this node: use --backend hierarchical (shared memory in each node, mpi "
                                     "between nodes) or mpi";
  }
  return backend;
}

std::unique_ptr<Communicator> makeCommunicator(const CommunicatorOptions& options) {
  const std::string backend = resolveBackend(options);
  if (backend == "shm") return makeShmCommunicator(options);
#ifdef COHORT_HAVE_NCCL
  if (backend == "nccl") return makeNcclCommunicator(options);
#endif
  // The default across nodes falls back to flat mpi where the nodes run different numbers of workers.
  if (backend == "hierarchical") return makeHierarchicalCommunicator(options, options.backend.empty());
  return makeMpiCommunicator(options);
}

void markProcessFailing() { mpi_detail::markProcessFailing(); }

}  // namespace cohort::collectives
