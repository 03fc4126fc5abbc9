// The data half of an mpi collective (mpi_state.h): one non-blocking MPI call per collective, and
// what follows it (reduce-scatter's sum in Open MPI's all-reduce order, avg's scaling, bf16's one
// rounding).
#include <openmpi/mpi.h>

#include <algorithm>
#include <cstring>

#include "collectives/mpi/mpi_state.h"
#include "runtime/dtype.h"

namespace cohort::collectives::mpi_detail {
namespace {

// In-place all-reduces from this size send from a copy (see startData).
constexpr uint64_t kInPlaceCopyBytes = 64 * 1024;

// Widens `count` bf16 values (bits) to fp32, and rounds fp32 values to bf16 once.
void widen(const void* bf16, float* out, size_t count) {
  const auto* in = static_cast<const uint16_t*>(bf16);
  for (size_t i = 0; i < count; ++i) out[i] = runtime::toFloat(runtime::Bf16{in[i]});
}
void narrow(const float* in, void* bf16, size_t count) {
  auto* out = static_cast<uint16_t*>(bf16);
  for (size_t i = 0; i < count; ++i) out[i] = runtime::toBf16(in[i]).bits;
}

// Grows `v` to at least n elements; never shrinks (its memory is reused).
float* atLeast(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}
MPI_Op mpiOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_SUM;
}

}  // namespace

// Every data collective is one non-blocking MPI call; bf16 reductions run in fp32 (Op::scratch)
// and are rounded once in testData.
void MpiState::startData(Op& op) {
  const Fingerprint& f = op.fingerprint;
  const int count = static_cast<int>(f.count);
  const bool bf16 = f.dtype == runtime::DType::kBF16;
  const size_t n = static_cast<size_t>(size_);
  switch (f.kind) {
    case CollectiveKind::kAllReduce: {
      if (bf16) {  // [0, count): the widened input; [count, 2 count): the fp32 result
        float* wide = atLeast(op.scratch, 2 * f.count);
        widen(op.input, wide, f.count);
        checkMpi(MPI_Iallreduce(wide, wide + f.count, count, MPI_FLOAT, mpiOp(f.op), dataComm_, &op.dataRequest),
                 "MPI_Iallreduce");
        break;
      }
      const bool inPlace = op.input == op.output;
      const void* send = inPlace ? MPI_IN_PLACE : op.input;
      // Open MPI's non-blocking all-reduce in place is always a reduce to one rank and a broadcast
      // (one direction at a time: half the bandwidth between nodes), so a large one sends from a
      // copy and gets the reduce-scatter/all-gather algorithms (GradSync's buckets are in place).
      if (inPlace && f.count * sizeof(float) >= kInPlaceCopyBytes) {
        float* copy = atLeast(op.scratch, f.count);
        std::memcpy(copy, op.output, f.count * sizeof(float));
        send = copy;
      }
      checkMpi(MPI_Iallreduce(send, op.output, count, MPI_FLOAT, mpiOp(f.op), dataComm_, &op.dataRequest),
               "MPI_Iallreduce");
      break;
    }
    case CollectiveKind::kReduceScatter: {
      // Every rank's chunk r goes to rank r (one exchange, both directions at once), and rank r
      // reduces what it received in the all-reduce's order (testData, reduceRows). Open MPI's MPI_Ireduce_scatter_block
      // reduces to one rank and scatters, which moves the whole buffer one way first: half the
      // bandwidth across nodes. NCCL's in place needs nothing special: the input is only read
      // by the exchange, and the output written after it. bf16: rows at [0, n count), the widened
      // input after them.
      float* rows = atLeast(op.scratch, (bf16 ? 2 * n : n) * f.count);
      const void* send = op.input;
      if (bf16) {
        widen(op.input, rows + n * f.count, n * f.count);
        send = rows + n * f.count;
      }
      checkMpi(MPI_Ialltoall(send, count, MPI_FLOAT, rows, count, MPI_FLOAT, dataComm_, &op.dataRequest),
               "MPI_Ialltoall (reduce-scatter)");
      break;
    }
    case CollectiveKind::kAllGather: {
      // NCCL's in place (input == output + rank*count) is MPI's MPI_IN_PLACE for an all-gather.
      const MPI_Datatype type = bf16 ? MPI_UINT16_T : MPI_FLOAT;
      const bool inPlace = op.input == static_cast<const char*>(op.output) +
                                           static_cast<size_t>(rank_) * f.count * runtime::sizeOf(f.dtype);
      checkMpi(MPI_Iallgather(inPlace ? MPI_IN_PLACE : op.input, count, type, op.output, count, type, dataComm_,
                              &op.dataRequest),
               "MPI_Iallgather");
      break;
    }
    case CollectiveKind::kBroadcast:
      checkMpi(MPI_Ibcast(op.output, count, bf16 ? MPI_UINT16_T : MPI_FLOAT, f.root, dataComm_, &op.dataRequest),
               "MPI_Ibcast");
      break;
    case CollectiveKind::kBarrier:
      checkMpi(MPI_Ibarrier(dataComm_, &op.dataRequest), "MPI_Ibarrier");
      break;
  }
  op.phase = Phase::kData;
}

void MpiState::testData(Op& op) {
  int done = 0;
  const int rc = MPI_Test(&op.dataRequest, &done, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) checkMpi(rc, op.fingerprint.str().c_str());  // the text only for the error
  if (!done) return;
  const Fingerprint& f = op.fingerprint;
  if (f.kind == CollectiveKind::kAllReduce || f.kind == CollectiveKind::kReduceScatter) finishReduction(op);
  op.phase = Phase::kDone;
}

// The result of an all-reduce or reduce-scatter in fp32 (the output itself, or scratch for bf16),
// avg's scaling, and bf16's one rounding.
void MpiState::finishReduction(Op& op) {
  const Fingerprint& f = op.fingerprint;
  const bool bf16 = f.dtype == runtime::DType::kBF16;
  const size_t n = static_cast<size_t>(size_);
  float* result = bf16 ? op.scratch.data() + f.count : static_cast<float*>(op.output);
  if (f.kind == CollectiveKind::kReduceScatter) {
    // bf16: the rows' sum goes where the widened input was (no longer needed).
    if (bf16) result = op.scratch.data() + n * f.count;
    reduceRows(op.scratch.data(), result, f.count, f.op);
  }
  if (f.op == ReduceOp::kAvg) {
    // avg is float(sum) * float(1/n) in every backend (docs/collectives.md): the scaling is the
    // same arithmetic everywhere; exact when n is a power of two.
    const float scale = 1.0f / static_cast<float>(size_);
    for (uint64_t i = 0; i < f.count; ++i) result[i] *= scale;
  }
  if (bf16) narrow(result, op.output, f.count);
}

// output[i] = op over ranks r of rows[r * count + i], in the order of Open MPI's MPI_Iallreduce
// (libnbc's binomial tree rooted at rank 0), so that a reduce-scatter gives each element the bits
// the all-reduce gives it: in rounds s = 1, 2, 4, ..., row r (a multiple of 2s) takes row r + s into
// it. 4 ranks: (r0 + r1) + (r2 + r3); 3: (r0 + r1) + r2. Open MPI 4.1 adds in that tree on every
// world size for messages below 64 KiB or in place, and on 2, 3, 4 and 6 ranks for any message
// (measured; 5 ranks' large out-of-place all-reduces take another order: docs/collectives.md). The
// rows are overwritten.
void MpiState::reduceRows(float* rows, float* output, uint64_t count, ReduceOp op) const {
  const auto n = static_cast<size_t>(size_);
  for (size_t stride = 1; stride < n; stride *= 2) {
    for (size_t r = 0; r + stride < n; r += 2 * stride) {
      float* into = rows + r * count;
      const float* from = rows + (r + stride) * count;
      for (uint64_t i = 0; i < count; ++i) {
        switch (op) {
          case ReduceOp::kSum:
          case ReduceOp::kAvg:
            into[i] += from[i];
            break;
          case ReduceOp::kMax:
            into[i] = std::max(into[i], from[i]);
            break;
          case ReduceOp::kMin:
            into[i] = std::min(into[i], from[i]);
            break;
        }
      }
    }
  }
  if (output != rows) std::memcpy(output, rows, count * sizeof(float));
}

}  // namespace cohort::collectives::mpi_detail
