// One collective of cudasim's NCCL as issued, and the reduction of the ranks' pieces: private to
// cudasim (nccl.cc checks and issues operations, nccl_comm.cc runs them).
// Thread safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "nccl.h"

namespace cudasim::nccl {

enum class Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast };

const char* nameOf(Kind kind);

// One collective as issued. count is the call's: per rank for reduce-scatter and all-gather.
struct Operation {
  Kind kind = Kind::kAllReduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  ncclDataType_t type = ncclFloat;
  ncclRedOp_t op = ncclSum;
  int root = 0;
  size_t elementBytes = 0;
  // Set at issue.
  uint64_t sequence = 0;   // the communicator's how-many-th collective
  uint64_t firstStep = 0;  // steps [firstStep, firstStep + steps)
  uint64_t steps = 0;

  // Elements every rank posts over all steps (the root alone has any in a broadcast).
  size_t postedElements(int nranks) const {
    return kind == Kind::kReduceScatter ? count * static_cast<size_t>(nranks) : count;
  }
  size_t sendBytes(int rank, int nranks) const {
    if (kind == Kind::kBroadcast && rank != root) return 0;
    return postedElements(nranks) * elementBytes;
  }
  size_t recvBytes(int nranks) const {
    return (kind == Kind::kAllGather ? count * static_cast<size_t>(nranks) : count) * elementBytes;
  }
  std::string describe() const { return std::string(nameOf(kind)) + " #" + std::to_string(sequence); }
};

// The bytes of one element of `type`; 0 for a type NCCL does not have.
size_t elementBytesOf(ncclDataType_t type);

// Calls f(T{}) with the C++ type of a type reductions take; false for the others.
template <class F>
bool withArithmeticType(ncclDataType_t type, F&& f) {
  switch (type) {
    case ncclInt8:
      return f(int8_t{}), true;
    case ncclUint8:
      return f(uint8_t{}), true;
    case ncclInt32:
      return f(int32_t{}), true;
    case ncclUint32:
      return f(uint32_t{}), true;
    case ncclInt64:
      return f(int64_t{}), true;
    case ncclUint64:
      return f(uint64_t{}), true;
    case ncclFloat32:
      return f(float{}), true;
    case ncclFloat64:
      return f(double{}), true;
    default:
      return false;
  }
}

// out[i] = in[0][i] op in[1][i] op ..., folded in rank order, so every rank gets the same bits;
// integers wrap, as on the GPU; floats are rounded at every step.
void reduce(ncclDataType_t type, ncclRedOp_t op, const std::vector<const char*>& in, char* out, size_t n);

}  // namespace cudasim::nccl
