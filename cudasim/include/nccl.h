// cudasim's nccl.h: the subset of NCCL that Cohort calls (collectives/nccl/, through the table in
// collectives/nccl/nccl_library.h), emulated on the CPU (docs/gpu.md, "The emulated device").
// Names, types, values and signatures are NCCL 2.28's, so the table's decltype(&::fn) match; only
// the cudasim configuration puts this directory on the include path.
//
// Ranks are processes of one machine (or threads of one process, one communicator each): they meet
// in a shared-memory segment that ncclGetUniqueId names (in $COHORT_SHM_DIR, else /dev/shm, which
// must be the same for every rank), and their collectives pass through it as operations of the
// emulated streams (cudasim::enqueue), so they are asynchronous and in stream order like the real
// kernels. Collectives are matched by issue order. Every rank gets the same bits: a reduction folds
// the ranks' values in rank order (ncclAvg of floating types premultiplies each by 1/nranks, as
// NCCL does; of integers it divides the sum). Beyond NCCL's checks, buffers must lie inside live
// device allocations (ncclInvalidArgument, where NCCL would fault or hang); counts of 0 do nothing.
// Two ranks on one GPU are refused, as NCCL refuses them (ncclInvalidUsage).
//
// Failures as NCCL reports them: a collective stops waiting when its communicator is aborted, or
// when a rank it waits for has exited, aborted or destroyed its communicator; the latter are
// ncclRemoteError from ncclCommGetAsyncError and from every later collective, the failed operation
// leaves its output unspecified, and the communicator's later operations do nothing, so its streams
// drain. ncclCommAbort returns within a millisecond or so even while a collective waits.
// Non-blocking communicators (ncclConfig_t::blocking = 0): ncclCommInitRankConfig returns
// ncclInProgress and joins in the background; ncclCommGetAsyncError says ncclInProgress until every
// rank has joined.
// Thread safety: as NCCL's; a communicator's calls from one thread at a time, except ncclCommAbort
// and ncclCommGetAsyncError, which any thread may call while another is inside a collective's wait.
//
//   ncclUniqueId id;                     // on one rank, then sent to the others
//   ncclGetUniqueId(&id);
//   ncclComm_t comm;
//   ncclCommInitRankConfig(&comm, nranks, id, rank, nullptr);  // blocking
//   ncclAllReduce(in, out, count, ncclFloat, ncclSum, comm, stream);
#pragma once

#include <climits>
#include <cstddef>

#include "cuda_runtime.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

extern "C" {

typedef struct ncclComm* ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL

// The real layout, so that NCCL_CONFIG_INITIALIZER fills it; only `blocking` means anything here
// (NCCL_CONFIG_UNDEF_INT: blocking, NCCL's default).
typedef struct ncclConfig_v22800 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
  int trafficClass;
  const char* commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                                                \
  {                                                                                                            \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_CONFIG_UNDEF_INT, \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,            \
        NCCL_CONFIG_UNDEF_INT                                                                                  \
  }

// The built-in operations (user-defined ones, ncclRedOpCreatePreMulSum, are not emulated).
// ncclMaxRedOp makes every int a value of the type, as in NCCL (ncclInvalidArgument, not undefined).
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

// Every type moves (all-gather, broadcast); reductions take all but the 16- and 8-bit floats.
typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

// Names a fresh rendezvous; creates nothing (the first rank to join creates the segment).
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
// On the current device; config may be null (blocking). A blocking call that fails leaves *comm null.
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
// Collective over comm: the ranks with the same color form a new communicator, ordered by key (ties
// by rank in comm); NCCL_SPLIT_NOCOLOR leaves *newcomm null. The colors are gathered as a
// collective of comm (in issue order with its others); config null: blocking as comm is.
#define NCCL_SPLIT_NOCOLOR -1
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
// Waits (blocking) or lets ncclCommGetAsyncError say ncclInProgress (non-blocking) until the
// communicator's collectives have run; later collectives are ncclInvalidUsage.
ncclResult_t ncclCommFinalize(ncclComm_t comm);
// Waits for the communicator's collectives, then frees it; before its non-blocking init has
// finished, the same as ncclCommAbort.
ncclResult_t ncclCommDestroy(ncclComm_t comm);
// Stops its collectives (they return, leaving outputs unspecified; queued ones do nothing), tells
// the other ranks, and frees it. ncclSuccess for a null communicator.
ncclResult_t ncclCommAbort(ncclComm_t comm);
const char* ncclGetErrorString(ncclResult_t result);
// The communicator's asynchronous error's message, else the last error message of the process;
// valid until this thread's next call.
const char* ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
// sendbuff is read on the root only.
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);

}  // extern "C"
