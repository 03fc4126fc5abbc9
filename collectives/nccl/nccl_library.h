// NcclLibrary: the NCCL functions the nccl backend calls, opened at run time by initNccl (the first
// communicator) rather than linked, so that a process that never creates an NCCL communicator (every
// CPU worker) never loads NCCL. The contract of these tables is in runtime/shared_library.h; this
// one opens libnccl.so.<NCCL_MAJOR>, falling back to COHORT_NCCL_DIR. Only built with CUDA and NCCL.
//
//   NcclLibrary nccl;
//   ncclUniqueId id;
//   nccl.getUniqueId(&id);
#pragma once

#include <nccl.h>

#include "runtime/shared_library.h"

namespace cohort::collectives::nccl {

struct NcclLibrary {
  NcclLibrary();

  runtime::SharedLibrary library;  // first: the functions below are resolved from it
  decltype(&::ncclGetUniqueId) const getUniqueId;
  decltype(&::ncclCommInitRankConfig) const commInitRankConfig;
  decltype(&::ncclCommSplit) const commSplit;
  decltype(&::ncclCommGetAsyncError) const commGetAsyncError;
  decltype(&::ncclCommFinalize) const commFinalize;
  decltype(&::ncclCommDestroy) const commDestroy;
  decltype(&::ncclCommAbort) const commAbort;
  decltype(&::ncclGetErrorString) const getErrorString;
  decltype(&::ncclGetLastError) const getLastError;
  decltype(&::ncclAllReduce) const allReduce;
  decltype(&::ncclReduceScatter) const reduceScatter;
  decltype(&::ncclAllGather) const allGather;
  decltype(&::ncclBroadcast) const broadcast;
};

}  // namespace cohort::collectives::nccl
