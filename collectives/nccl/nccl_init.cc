#include "collectives/nccl/nccl_init.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <thread>
#include <vector>

#include "collectives/mpi/mpi_store.h"
#include "collectives/nccl/gpu_assignment.h"
#include "collectives/nccl/node_rendezvous.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/error.h"
#include "runtime/stream.h"

namespace cohort::collectives::nccl {
namespace {

using Clock = std::chrono::steady_clock;

static_assert(sizeof(ncclUniqueId) == kUniqueIdBytes, "node_rendezvous.h's kUniqueIdBytes must match NCCL's");

std::string seconds(std::chrono::milliseconds d) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << d.count() / 1000.0 << " s";
  return os.str();
}

UniqueIdBytes makeUniqueId(const NcclLibrary& nccl, int rank) {
  ncclUniqueId id;
  if (ncclResult_t r = nccl.getUniqueId(&id); r != ncclSuccess) throwNccl(nccl, r, "ncclGetUniqueId", rank, nullptr);
  UniqueIdBytes bytes;
  std::memcpy(bytes.data(), &id, kUniqueIdBytes);
  return bytes;
}

ncclUniqueId toUniqueId(const UniqueIdBytes& bytes) {
  ncclUniqueId id;
  std::memcpy(&id, bytes.data(), kUniqueIdBytes);
  return id;
}

int visibleDeviceCount() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess) return count;
  cudaGetLastError();
  if (status == cudaErrorNoDevice) return 0;
  COHORT_THROW(InvalidArgument) << "the nccl backend needs a CUDA device, but the CUDA runtime cannot list them: "
                                << cudaGetErrorName(status) << " (" << cudaGetErrorString(status) << ")";
}

std::string busIdOf(int device) {
  char busId[64] = {};
  COHORT_CUDA_CHECK(cudaDeviceGetPCIBusId(busId, sizeof busId, device));
  return busId;
}

// Across nodes: global rank 0 makes the id and every rank reads it from the MPI store.
UniqueIdBytes uniqueIdThroughMpi(const NcclLibrary& nccl, const runtime::WorldInfo& world,
                                 std::chrono::milliseconds timeout) {
  const std::string key = "nccl-unique-id";
  MpiStore store(timeout);  // collective over MPI_COMM_WORLD
  if (world.rank == 0) {
    const UniqueIdBytes id = makeUniqueId(nccl, world.rank);
    store.set(key, std::vector<uint8_t>(id.begin(), id.end()));
  }
  const std::vector<uint8_t> value = store.get(key, timeout);
  if (value.size() != kUniqueIdBytes) {
    COHORT_THROW(IoError) << "nccl: the unique id from rank 0 has " << value.size() << " bytes, expected "
                          << kUniqueIdBytes << " (do all ranks run the same build?)";
  }
  UniqueIdBytes id;
  std::copy(value.begin(), value.end(), id.begin());
  return id;
}

ncclComm_t createCommunicator(const NcclLibrary& nccl, const runtime::WorldInfo& world, const ncclUniqueId& id,
                              std::chrono::milliseconds timeout) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once, so every wait below is ours and bounded
  ncclComm_t comm = nullptr;
  const Clock::time_point deadline = Clock::now() + timeout;
  ncclResult_t result = nccl.commInitRankConfig(&comm, world.worldSize, id, world.rank, &config);
  if (result == ncclSuccess || result == ncclInProgress) {
    std::optional<ncclResult_t> state = pollWhileInProgress(nccl, comm, deadline);
    if (!state) {
      nccl.commAbort(comm);
      COHORT_THROW(TimeoutError) << "nccl: creating the communicator did not finish within " << seconds(timeout)
                                 << " on rank " << world.rank << " of " << world.worldSize
                                 << ": a rank did not start it, or the ranks cannot reach each other "
                                 << "(NCCL_DEBUG=INFO shows how far it got)";
    }
    result = *state;
  }
  if (result != ncclSuccess) {
    const std::string message = ncclMessage(nccl, result, comm);
    if (comm != nullptr) nccl.commAbort(comm);
    COHORT_THROW(PeerError) << "nccl: ncclCommInitRankConfig failed on rank " << world.rank << " of " << world.worldSize
                            << ": " << message;
  }
  return comm;
}

}  // namespace

std::string ncclMessage(const NcclLibrary& nccl, ncclResult_t result, ncclComm_t comm) {
  std::string text = nccl.getErrorString(result);
  const char* last = nccl.getLastError(comm);
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
  return text;
}

void throwNccl(const NcclLibrary& nccl, ncclResult_t result, const std::string& what, int rank, ncclComm_t comm) {
  const std::string message =
      "nccl: " + what + " failed on rank " + std::to_string(rank) + ": " + ncclMessage(nccl, result, comm);
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      throw InvalidArgument(message);
    case ncclSystemError:
    case ncclRemoteError:
      throw PeerError(message);
    default:
      throw Error(message);
  }
}

std::optional<ncclResult_t> pollWhileInProgress(const NcclLibrary& nccl, ncclComm_t comm, Clock::time_point deadline) {
  std::chrono::microseconds sleep{10};
  for (;;) {
    ncclResult_t state = ncclSuccess;
    if (ncclResult_t r = nccl.commGetAsyncError(comm, &state); r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
  }
}

NcclSetup initNccl(const CommunicatorOptions& options) {
  auto nccl = std::make_shared<const NcclLibrary>();
  const runtime::WorldInfo& world = options.world;
  const int device =
      checkDeviceForLocalRank(world.localRank, visibleDeviceCount(), std::getenv("CUDA_VISIBLE_DEVICES"));
  if (options.computeStream != nullptr && options.computeStream->device() != runtime::Device::cuda(device)) {
    COHORT_THROW(InvalidArgument) << "the nccl backend of local rank " << world.localRank << " runs on cuda:" << device
                                  << ", but its compute stream is " << options.computeStream->describe();
  }
  runtime::cuda::CudaDeviceGuard guard(device);

  const bool idOnNode = !world.spansNodes();
  const int rank = world.rank;
  NodeRendezvousResult met =
      rendezvousOnNode({.jobId = world.jobId,
                        .rank = world.rank,
                        .localRank = world.localRank,
                        .localWorldSize = world.localWorldSize,
                        .generation = static_cast<uint64_t>(world.restartCount),
                        .timeout = options.timeout},
                       {.deviceIndex = device, .busId = busIdOf(device)},
                       idOnNode ? std::function<UniqueIdBytes()>([&nccl, rank] { return makeUniqueId(*nccl, rank); })
                                : std::function<UniqueIdBytes()>());
  checkDistinctGpus(met.gpus);
  if (idOnNode) {
    COHORT_CHECK(met.uniqueId.has_value()) << "the node rendezvous returned no NCCL unique id";
  }
  const UniqueIdBytes id = idOnNode ? *met.uniqueId : uniqueIdThroughMpi(*nccl, world, options.timeout);
  ncclComm_t comm = createCommunicator(*nccl, world, toUniqueId(id), options.timeout);
  return {.nccl = std::move(nccl), .comm = comm, .device = device};
}

}  // namespace cohort::collectives::nccl
