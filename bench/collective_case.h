// One collective that `cohort bench allreduce` times (allreduce_bench.h): all-reduce, reduce-scatter
// or all-gather, in fp32 or bf16, out of place or in NCCL's in-place layout, on a message of
// `bytes` (nccl-tests' convention: the full buffer, the all-reduce's input and output, the
// reduce-scatter's input, the all-gather's output; a rank's chunk is bytes / n). How its input is
// filled with exactly predictable values, how it is issued, and how its result is checked.
// Pure functions over caller-owned host memory; the harness copies to and from device memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/dtype.h"

namespace cohort::bench {

enum class CollectiveKind { kAllReduce, kReduceScatter, kAllGather };

struct CollectiveCase {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  runtime::DType dtype = runtime::DType::kF32;
  collectives::ReduceOp op = collectives::ReduceOp::kSum;
  bool inPlace = false;
};

// "allreduce", "reducescatter", "allgather"; "fp32", "bf16" (InvalidArgument otherwise).
CollectiveKind parseCollective(const std::string& name);
const char* collectiveName(CollectiveKind kind);
runtime::DType parseDType(const std::string& name);
const char* dtypeShortName(runtime::DType dtype);  // "fp32", "bf16"

// Where one rank's buffers of a message lie: the element count the collective is called with, and
// the byte offsets of its input and output in the two buffers (in place they are one buffer).
struct CaseLayout {
  size_t count = 0;        // allReduce: elements; reduceScatter, allGather: elements per rank
  size_t wholeBytes = 0;   // the full buffer actually used (bytes rounded down to whole elements)
  size_t inputOffset = 0;  // bytes
  size_t outputOffset = 0;
  size_t inputBytes = 0;
  size_t outputBytes = 0;
};
CaseLayout layoutOf(const CollectiveCase& c, size_t bytes, int rank, int n);

// busbw / algbw (nccl-tests' doc/PERFORMANCE.md): 2(n-1)/n for all-reduce, (n-1)/n otherwise.
double busFactor(CollectiveKind kind, int n);

// Fills this rank's input (at layout.inputOffset of `input`, which in place is the output buffer).
void fillInput(const CollectiveCase& c, const CaseLayout& layout, int rank, void* input);
// Issues the collective (input and output are the buffers' starts; the layout's offsets apply).
collectives::WorkPtr issue(collectives::Communicator& comm, const CollectiveCase& c, const CaseLayout& layout,
                           void* input, void* output);
// Mismatching elements of this rank's output, and out of place of its input, against the exact
// result (small integers, exact in fp32 and bf16; avg also accepts the exact value's neighbours).
size_t countWrong(const CollectiveCase& c, const CaseLayout& layout, int rank, int n, const void* input,
                  const void* output);

}  // namespace cohort::bench
