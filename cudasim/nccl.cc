// NCCL as cudasim emulates it (include/nccl.h): communicators whose ranks are processes meeting in a
// shared-memory segment, and collectives that run as operations of the emulated streams.
//
// The segment. ncclGetUniqueId only names it: <dir>/cudasim-nccl-<pid>-<random>, dir being
// $COHORT_CUDASIM_NCCL_DIR, else $COHORT_SHM_DIR or /dev/shm as for Cohort's own segments. The id holds the name and a hash of dir
// (a test's dir may not fit in 128 bytes): each rank takes dir from its own environment, and one that
// sees another dir is refused (ncclInvalidUsage) rather than left waiting.
//
// The segment, the steps of a collective and when a wait gives up: nccl_comm.h. Here: the API,
// which checks its arguments as NCCL does and hands the work to the communicator (Comm), the live
// handles, and the process's last error.
#include "nccl.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cudasim/nccl_comm.h"
#include "cudasim/nccl_operation.h"
#include "cudasim/sim.h"

namespace cudasim::nccl {
namespace {

constexpr char kIdMagic[8] = {'c', 'u', 'd', 'a', 's', 'i', 'm', 'N'};
constexpr size_t kNameBytes = NCCL_UNIQUE_ID_BYTES - sizeof kIdMagic - sizeof(uint64_t);  // with its NUL
constexpr unsigned kConfigMagic = 0xcafebeef;

// Live handles, so that a destroyed or made-up communicator is ncclInvalidArgument, not a crash;
// and the process's last error message.
struct Registry {
  std::mutex m;
  std::set<ncclComm_t> live;
  std::string lastError;
};

Registry* gRegistry = nullptr;

// A forked child has none of its parent's communicators (their threads are not there), and another
// thread may have held the lock at the fork.
void resetAfterFork() { gRegistry = new Registry; }

Registry& registry() {
  static const bool once = [] {
    gRegistry = new Registry;  // never destroyed: stream threads may outlive static destruction
    pthread_atfork(nullptr, nullptr, resetAfterFork);
    return true;
  }();
  (void)once;
  return *gRegistry;
}

}  // namespace

void setProcessLastError(const std::string& message) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  r.lastError = message;
}

namespace {

ncclResult_t refuse(ncclResult_t result, const std::string& message) {
  setProcessLastError("cudasim NCCL: " + message);
  return result;
}

// The directory of the segments: $COHORT_CUDASIM_NCCL_DIR, else $COHORT_SHM_DIR, else /dev/shm. Real
// NCCL reaches another node over the network, whatever that node's /dev/shm: a test that plays
// several nodes on one machine gives each its own COHORT_SHM_DIR and every rank this one directory.
std::string shmDirectory() {
  for (const char* name : {"COHORT_CUDASIM_NCCL_DIR", "COHORT_SHM_DIR"}) {
    const char* dir = std::getenv(name);
    if (dir && *dir) return dir;
  }
  return "/dev/shm";
}

uint64_t hashOf(const std::string& text) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The id's layout: kIdMagic, the hash of the directory, the segment's name.
struct IdLayout {
  char magic[sizeof kIdMagic];
  uint64_t directoryHash;
  char name[kNameBytes];
};
static_assert(sizeof(IdLayout) == NCCL_UNIQUE_ID_BYTES);

// The segment's path a unique id names here, or an error: not one of ours, or another directory.
Outcome pathOf(const ncclUniqueId& id, std::string& path) {
  IdLayout layout;
  std::memcpy(&layout, id.internal, sizeof layout);
  const size_t length = strnlen(layout.name, kNameBytes);
  if (std::memcmp(layout.magic, kIdMagic, sizeof kIdMagic) != 0 || length == 0 || length == kNameBytes) {
    return Outcome::error(ncclInvalidArgument, "ncclCommInitRankConfig: not a unique id from ncclGetUniqueId");
  }
  const std::string dir = shmDirectory();
  if (hashOf(dir) != layout.directoryHash) {
    return Outcome::error(ncclInvalidUsage,
                          "ncclCommInitRankConfig: the unique id was made with another "
                          "COHORT_CUDASIM_NCCL_DIR or COHORT_SHM_DIR than this rank's (" +
                              dir + ")");
  }
  path = dir + "/" + std::string(layout.name, length);
  return {};
}

}  // namespace
}  // namespace cudasim::nccl

// The handle: the state, and the thread of a non-blocking init.
struct ncclComm {
  std::shared_ptr<cudasim::nccl::Comm> state;
  bool blocking = true;
  std::thread joiner;
};

namespace cudasim::nccl {
namespace {

std::shared_ptr<Comm> find(ncclComm_t comm) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  return r.live.count(comm) ? comm->state : nullptr;
}

// Removes the handle from the live ones; nullptr when it is not one.
std::unique_ptr<ncclComm> take(ncclComm_t comm) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  return r.live.erase(comm) ? std::unique_ptr<ncclComm>(comm) : nullptr;
}

ncclComm_t publish(std::unique_ptr<ncclComm> handle) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  r.live.insert(handle.get());
  return handle.release();
}

void abortHandle(std::unique_ptr<ncclComm> handle) {
  handle->state->requestAbort();
  if (handle->joiner.joinable()) handle->joiner.join();
  handle->state->leave(kAborted);
  handle->state->stopRunning();
}

// Checks a collective's arguments as NCCL does, and beyond it that its buffers are device memory;
// then issues it.
ncclResult_t submit(ncclComm_t comm, cudaStream_t stream, Operation op) {
  const std::string name = nameOf(op.kind);
  std::shared_ptr<Comm> state = find(comm);
  if (!state) return refuse(ncclInvalidArgument, name + ": not a live communicator");
  const int rank = state->rank(), nranks = state->nranks();
  op.elementBytes = elementBytesOf(op.type);
  if (op.elementBytes == 0) return refuse(ncclInvalidArgument, name + ": invalid datatype " + std::to_string(op.type));
  const bool reduces = op.kind == Kind::kAllReduce || op.kind == Kind::kReduceScatter;
  if (reduces && (op.op < ncclSum || op.op >= ncclNumOps)) {
    return refuse(ncclInvalidArgument, name + ": invalid reduction operation " + std::to_string(op.op));
  }
  if (reduces && !withArithmeticType(op.type, [](auto) {})) {
    return refuse(ncclInvalidArgument, name + ": reductions of datatype " + std::to_string(op.type) +
                                           " (16- and 8-bit floats) are not emulated");
  }
  if (op.kind == Kind::kBroadcast && (op.root < 0 || op.root >= nranks)) {
    return refuse(ncclInvalidArgument,
                  name + ": root " + std::to_string(op.root) + " is not a rank of " + std::to_string(nranks));
  }
  if (op.count == 0) return ncclSuccess;
  const std::pair<const void*, size_t> buffers[] = {{op.send, op.sendBytes(rank, nranks)},
                                                    {op.recv, op.recvBytes(nranks)}};
  for (const auto& [p, bytes] : buffers) {
    if (bytes == 0 || cudasim::isDeviceRange(p, bytes)) continue;
    std::ostringstream os;
    os << name << " on rank " << rank << ": " << (p == op.send ? "sendbuff " : "recvbuff ") << p << " (" << bytes
       << " bytes) does not lie inside one device allocation";
    return refuse(ncclInvalidArgument, os.str());
  }
  const size_t perStep = kSlotBytes / op.elementBytes;
  op.steps = (op.postedElements(nranks) + perStep - 1) / perStep;
  return state->issue(op, stream);
}

const char* threadCopy(std::string text) {
  thread_local std::string copy;
  copy = std::move(text);
  return copy.c_str();
}

}  // namespace
}  // namespace cudasim::nccl

using namespace cudasim::nccl;

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return refuse(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is null");
  std::random_device random;
  char name[kNameBytes];
  std::snprintf(name, sizeof name, "cudasim-nccl-%d-%08x%08x", static_cast<int>(::getpid()), random(), random());
  IdLayout layout{};
  std::memcpy(layout.magic, kIdMagic, sizeof kIdMagic);
  layout.directoryHash = hashOf(shmDirectory());
  std::memcpy(layout.name, name, sizeof name);
  std::memcpy(uniqueId->internal, &layout, sizeof layout);
  return ncclSuccess;
}

}  // extern "C"

namespace cudasim::nccl {
namespace {

// ncclCommInitRankConfig and ncclCommSplit: joins the communicator whose segment is `path`.
ncclResult_t initAt(ncclComm_t* comm, int nranks, const std::string& path, int rank, ncclConfig_t* config) {
  if (config && config->magic != kConfigMagic) {
    return refuse(ncclInvalidArgument, "ncclCommInitRankConfig: config was not set from NCCL_CONFIG_INITIALIZER");
  }
  const bool blocking = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
  int device = 0;
  char busId[32] = {};
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetPCIBusId(busId, sizeof busId, device) != cudaSuccess) {
    const cudaError_t e = cudaGetLastError();
    return refuse(ncclUnhandledCudaError,
                  std::string("ncclCommInitRankConfig: no current CUDA device: ") + cudaGetErrorString(e));
  }
  auto handle = std::make_unique<ncclComm>();
  handle->state = std::make_shared<Comm>(rank, nranks, path, busId);
  handle->blocking = blocking;
  if (blocking) {
    const Outcome joined = handle->state->join();
    handle->state->finishInit(joined);
    if (!joined.ok()) {
      handle->state->leave(kAborted);
      return refuse(joined.result, joined.message);
    }
    *comm = publish(std::move(handle));
    return ncclSuccess;
  }
  handle->joiner = std::thread([state = handle->state] { state->finishInit(state->join()); });
  *comm = publish(std::move(handle));
  return ncclInProgress;
}

// Every rank's (color, key), gathered over `parent` as one of its collectives, on a stream of its
// own that the host waits for (NCCL's split is a host call). The result's first error, if any.
ncclResult_t gatherColors(const std::shared_ptr<Comm>& parent, int color, int key, std::vector<int32_t>& all) {
  const int32_t mine[2] = {color, key};
  all.assign(2 * static_cast<size_t>(parent->nranks()), 0);
  Operation op{.kind = Kind::kAllGather, .send = mine, .recv = all.data(), .count = 2, .type = ncclInt32};
  op.elementBytes = sizeof(int32_t);
  op.steps = 1;
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    return refuse(ncclUnhandledCudaError, "ncclCommSplit: cannot create a stream");
  }
  ncclResult_t result = parent->issue(op, stream);
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  if (result == ncclSuccess) result = parent->asyncError();
  return result;
}

}  // namespace
}  // namespace cudasim::nccl

extern "C" {

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  if (!comm) return refuse(ncclInvalidArgument, "ncclCommInitRankConfig: comm is null");
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return refuse(ncclInvalidArgument, "ncclCommInitRankConfig: rank " + std::to_string(rank) + " of " +
                                           std::to_string(nranks) + " is not a rank");
  }
  std::string path;
  if (const Outcome named = pathOf(commId, path); !named.ok()) return refuse(named.result, named.message);
  return initAt(comm, nranks, path, rank, config);
}

// The groups' segments are named after the parent's: <parent's path>-s<k>c<color>, k counting the
// parent's splits. The new communicator's rank is its place by (key, parent rank), as in NCCL.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (!newcomm) return refuse(ncclInvalidArgument, "ncclCommSplit: newcomm is null");
  *newcomm = nullptr;
  std::shared_ptr<Comm> parent = find(comm);
  if (!parent) return refuse(ncclInvalidArgument, "ncclCommSplit: not a live communicator");
  if (color < NCCL_SPLIT_NOCOLOR) {
    return refuse(ncclInvalidArgument, "ncclCommSplit: color " + std::to_string(color) + " is negative");
  }
  std::vector<int32_t> all;
  if (const ncclResult_t r = gatherColors(parent, color, key, all); r != ncclSuccess) return r;
  const uint64_t index = parent->nextSplit();
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  std::vector<int> members;
  for (int r = 0; r < parent->nranks(); ++r) {
    if (all[2 * static_cast<size_t>(r)] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[2 * static_cast<size_t>(a) + 1] < all[2 * static_cast<size_t>(b) + 1];
  });
  const int rank = static_cast<int>(std::find(members.begin(), members.end(), parent->rank()) - members.begin());
  const std::string path = parent->path() + "-s" + std::to_string(index) + "c" + std::to_string(color);
  if (!config) {  // NCCL: the parent's configuration; here, whether it blocks
    static ncclConfig_t nonBlocking = [] {
      ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
      c.blocking = 0;
      return c;
    }();
    if (!comm->blocking) config = &nonBlocking;
  }
  return initAt(newcomm, static_cast<int>(members.size()), path, rank, config);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!asyncError) return refuse(ncclInvalidArgument, "ncclCommGetAsyncError: asyncError is null");
  std::shared_ptr<Comm> state = find(comm);
  if (!state) return refuse(ncclInvalidArgument, "ncclCommGetAsyncError: not a live communicator");
  *asyncError = state->asyncError();
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  std::shared_ptr<Comm> state = find(comm);
  if (!state) return refuse(ncclInvalidArgument, "ncclCommFinalize: not a live communicator");
  const ncclResult_t result = state->finalize(comm->blocking);
  if (result == ncclInvalidUsage) return refuse(result, "ncclCommFinalize before the communicator finished joining");
  return result;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  std::unique_ptr<ncclComm> handle = take(comm);
  if (!handle) return refuse(ncclInvalidArgument, "ncclCommDestroy: not a live communicator");
  if (!handle->state->initDone()) {
    abortHandle(std::move(handle));
    return ncclSuccess;
  }
  if (handle->joiner.joinable()) handle->joiner.join();
  handle->state->waitIdle();
  handle->state->leave(kLeft);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  std::unique_ptr<ncclComm> handle = take(comm);
  if (!handle) return refuse(ncclInvalidArgument, "ncclCommAbort: not a live communicator");
  abortHandle(std::move(handle));
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  if (std::shared_ptr<Comm> state = find(comm)) {
    if (std::string own = state->lastError(); !own.empty()) return threadCopy(std::move(own));
  }
  Registry& r = registry();
  std::lock_guard lock(r.m);
  return threadCopy(r.lastError);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return submit(
      comm, stream,
      {.kind = Kind::kAllReduce, .send = sendbuff, .recv = recvbuff, .count = count, .type = datatype, .op = op});
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return submit(comm, stream,
                {.kind = Kind::kReduceScatter,
                 .send = sendbuff,
                 .recv = recvbuff,
                 .count = recvcount,
                 .type = datatype,
                 .op = op});
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return submit(comm, stream,
                {.kind = Kind::kAllGather, .send = sendbuff, .recv = recvbuff, .count = sendcount, .type = datatype});
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return submit(
      comm, stream,
      {.kind = Kind::kBroadcast, .send = sendbuff, .recv = recvbuff, .count = count, .type = datatype, .root = root});
}

}  // extern "C"
