#include "collectives/nccl/gpu_assignment.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "runtime/error.h"

namespace cohort::collectives::nccl {
namespace {

std::string canonicalBusId(std::string id) {
  std::transform(id.begin(), id.end(), id.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return id;
}

}  // namespace

int checkDeviceForLocalRank(int localRank, int visibleDeviceCount, const char* cudaVisibleDevices) {
  if (localRank < 0) COHORT_THROW(InvalidArgument) << "the nccl backend got a negative local rank " << localRank;
  if (localRank < visibleDeviceCount) return localRank;
  std::ostringstream os;
  os << "the nccl backend runs local rank " << localRank << " on cuda:" << localRank << ", but this process sees ";
  if (visibleDeviceCount <= 0)
    os << "no CUDA device";
  else
    os << "only " << visibleDeviceCount << (visibleDeviceCount == 1 ? " CUDA device" : " CUDA devices");
  if (cudaVisibleDevices != nullptr) os << " (CUDA_VISIBLE_DEVICES=" << cudaVisibleDevices << ")";
  os << ": start at most one rank per GPU on each node (cohortrun --nproc-per-node, mpirun -npernode), "
     << "and let every local rank see all of the node's GPUs";
  throw InvalidArgument(os.str());
}

void checkDistinctGpus(const std::vector<RankGpu>& gpus) {
  std::vector<const RankGpu*> byLocalRank;
  for (const RankGpu& g : gpus) byLocalRank.push_back(&g);
  std::sort(byLocalRank.begin(), byLocalRank.end(),
            [](const RankGpu* a, const RankGpu* b) { return a->localRank < b->localRank; });
  for (size_t j = 1; j < byLocalRank.size(); ++j) {
    for (size_t i = 0; i < j; ++i) {
      const RankGpu& a = *byLocalRank[i];
      const RankGpu& b = *byLocalRank[j];
      if (canonicalBusId(a.busId) != canonicalBusId(b.busId)) continue;
      COHORT_THROW(InvalidArgument) << "local ranks " << a.localRank << " (rank " << a.rank
                                    << ", cuda:" << a.deviceIndex << ") and " << b.localRank << " (rank " << b.rank
                                    << ", cuda:" << b.deviceIndex << ") are both on GPU " << a.busId
                                    << ": NCCL cannot run two ranks on one GPU; give every local rank the same "
                                    << "CUDA_VISIBLE_DEVICES (or none), so that local rank k uses the node's k-th GPU";
    }
  }
}

}  // namespace cohort::collectives::nccl
