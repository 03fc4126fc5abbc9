#include "collectives/placement.h"

#include <cstdint>

#include "runtime/error.h"

namespace cohort::collectives {
namespace {

bool disjoint(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return aBytes == 0 || bBytes == 0 || x + aBytes <= y || y + bBytes <= x;
}

// `chunk` is where this rank's chunk of `full` lies for NCCL's in place.
Placement placement(const char* collective, const void* full, const void* chunk, size_t countPerRank,
                    runtime::DType dtype, int rank, int size) {
  const size_t chunkBytes = countPerRank * runtime::sizeOf(dtype);
  const auto* ownChunk = static_cast<const char*>(full) + static_cast<size_t>(rank) * chunkBytes;
  if (chunk == ownChunk) return Placement::kInPlace;
  if (disjoint(full, chunkBytes * static_cast<size_t>(size), chunk, chunkBytes)) return Placement::kOutOfPlace;
  COHORT_THROW(InvalidArgument) << collective << ": the input and output overlap, but not in NCCL's in-place layout "
                                << "(rank " << rank << "'s chunk of " << countPerRank << " elements at offset "
                                << static_cast<size_t>(rank) * countPerRank << " of the full buffer; "
                                << "docs/collectives.md, \"In place\")";
}

}  // namespace

Placement reduceScatterPlacement(const void* input, const void* output, size_t countPerRank, runtime::DType dtype,
                                 int rank, int size) {
  checkBuffers(input, output, countPerRank, "reduceScatter");
  return placement("reduceScatter", input, output, countPerRank, dtype, rank, size);
}

Placement allGatherPlacement(const void* input, const void* output, size_t countPerRank, runtime::DType dtype,
                             int rank, int size) {
  checkBuffers(input, output, countPerRank, "allGather");
  return placement("allGather", output, input, countPerRank, dtype, rank, size);
}

void checkBuffers(const void* input, const void* output, size_t count, const char* collective) {
  if (count > 0 && (input == nullptr || output == nullptr)) {
    COHORT_THROW(InvalidArgument) << collective << ": null buffer for " << count << " elements";
  }
}

void checkRoot(int root, int size) {
  if (root < 0 || root >= size) {
    COHORT_THROW(InvalidArgument) << "broadcast root " << root << " is not a rank of this " << size
                                  << "-rank communicator";
  }
}

Fingerprint allReduceCall(const void* input, const void* output, size_t count, const AllReduceOptions& options) {
  checkBuffers(input, output, count, "allReduce");
  return {.kind = CollectiveKind::kAllReduce, .op = options.op, .dtype = options.dtype, .count = count};
}

Fingerprint reduceScatterCall(const void* input, const void* output, size_t countPerRank,
                              const ReduceScatterOptions& options, int rank, int size) {
  reduceScatterPlacement(input, output, countPerRank, options.dtype, rank, size);
  return {.kind = CollectiveKind::kReduceScatter, .op = options.op, .dtype = options.dtype, .count = countPerRank};
}

Fingerprint allGatherCall(const void* input, const void* output, size_t countPerRank, const AllGatherOptions& options,
                          int rank, int size) {
  allGatherPlacement(input, output, countPerRank, options.dtype, rank, size);
  return {.kind = CollectiveKind::kAllGather, .dtype = options.dtype, .count = countPerRank};
}

Fingerprint broadcastCall(const void* data, size_t count, const BroadcastOptions& options, int size) {
  checkBuffers(data, data, count, "broadcast");
  checkRoot(options.root, size);
  return {.kind = CollectiveKind::kBroadcast, .dtype = options.dtype, .root = options.root, .count = count};
}

}  // namespace cohort::collectives
