// Argument checks every backend shares: where a collective's input and output lie relative to each
// other (NCCL's in-place layout for reduce-scatter and all-gather, communicator.h), null buffers,
// and the broadcast root. Pure functions; they throw InvalidArgument naming the problem.
#pragma once

#include <cstddef>

#include "collectives/communicator.h"

namespace cohort::collectives {

enum class Placement : uint8_t { kOutOfPlace, kInPlace };

// reduceScatter: in place when output == input + rank*countPerRank (NCCL's layout); out of place
// when [output, +countPerRank) and [input, +size*countPerRank) are disjoint; else InvalidArgument.
Placement reduceScatterPlacement(const void* input, const void* output, size_t countPerRank, runtime::DType dtype,
                                 int rank, int size);
// allGather: in place when input == output + rank*countPerRank; out of place when disjoint.
Placement allGatherPlacement(const void* input, const void* output, size_t countPerRank, runtime::DType dtype,
                             int rank, int size);
// Null input or output for count > 0 elements.
void checkBuffers(const void* input, const void* output, size_t count, const char* collective);
void checkRoot(int root, int size);

// A collective's arguments checked as above (allReduce: null buffers; broadcast: null data and the
// root), and its Fingerprint (sequence 0: the backend numbers it).
Fingerprint allReduceCall(const void* input, const void* output, size_t count, const AllReduceOptions& options);
Fingerprint reduceScatterCall(const void* input, const void* output, size_t countPerRank,
                              const ReduceScatterOptions& options, int rank, int size);
Fingerprint allGatherCall(const void* input, const void* output, size_t countPerRank, const AllGatherOptions& options,
                          int rank, int size);
Fingerprint broadcastCall(const void* data, size_t count, const BroadcastOptions& options, int size);

}  // namespace cohort::collectives
