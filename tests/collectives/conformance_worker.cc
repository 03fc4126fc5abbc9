// The collectives conformance worker: one process of a job that runs every Communicator operation
// and checks the results exactly. Backend-agnostic (only the Communicator interface and
// makeCommunicator()), so the same program runs under cohortrun (shm) and mpirun (mpi).
//
//   cohortrun --nproc-per-node 3 -- conformance_worker --backend shm [--timeout-ms 60000]
//       [--buffers user|shared|mixed]
//
// Covers: allReduce (sum, avg, max, min), reduceScatter (same ops), allGather, broadcast from every
// root, barrier; each out of place and in place (allReduce: input == output; reduceScatter and
// allGather in NCCL's layout, communicator.h: this rank's chunk at offset rank*countPerRank of the
// full buffer); counts 0, 1, 7, 13*n+5 (not divisible by n), 1000003 and 2^20+3; several
// collectives issued before the first wait; each in fp32 and, up to 1000003, in bf16 (the values
// below are exact in bf16 too, so are their sums). Then split() (split_checks.h): the node group,
// the same-local-rank group, and more. Last, rank 1 issues an all-reduce in bf16 where
// the others issue fp32: every rank must throw InvalidArgument naming both element types.
// --simulate-nodes K tells the backend that the job's ranks are K nodes of size/K consecutive
// ranks each (local rank, node size, and a job id per node), so the hierarchical backend runs both
// of its levels on one host. Buffers are ordinary memory
// (--buffers user, the default), from Communicator::allocateBuffer (shared; the shm backend's direct
// all-reduce), or allocated on every rank but used on even ranks only (mixed: every rank must still
// agree on one path).
// Data: rank r's element i is value(r, i) = ((5i + 3r) mod 11) + 1 + r, a small integer, so sums,
// maxima and minima are exact in float32 in any order. avg is defined as float(sum) * float(1/n)
// (docs/collectives.md): exact when n is a power of two, so then checked with tolerance 0; for other
// n a backend may round the last step differently (e.g. divide by n), so it is checked against the
// double-precision mean with a relative tolerance of 2^-22 (two float32 ulps).
// Prints one line per failed case, "rank R: allreduce(sum) count N in-place: element i = x,
// expected y", and exits 1 on any failure, 0 when all pass, or the cohort exit code of an error.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "collectives/communicator.h"        // Communicator, makeCommunicator
#include "runtime/dtype.h"                   // DType, bf16 conversions
#include "runtime/error.h"                   // cohort::Error and its exit codes
#include "runtime/world_info.h"              // WorldInfo::detect
#include "tests/collectives/split_checks.h"  // checkSplit

namespace {

using cohort::collectives::Communicator;
using cohort::collectives::ReduceOp;
using cohort::runtime::DType;
using Clock = std::chrono::steady_clock;

float value(int rank, size_t i) { return static_cast<float>((5 * i + 3 * static_cast<size_t>(rank)) % 11 + 1 + rank); }

// The exact reduction of value(·, i) over n ranks, and whether a result x matches it.
struct Reference {
  int n;
  double expect(ReduceOp op, size_t i) const {
    double sum = 0, hi = -1e30, lo = 1e30;
    for (int r = 0; r < n; ++r) {
      double v = value(r, i);
      sum += v;
      hi = std::max(hi, v);
      lo = std::min(lo, v);
    }
    if (op == ReduceOp::kSum) return sum;
    if (op == ReduceOp::kMax) return hi;
    if (op == ReduceOp::kMin) return lo;
    if ((n & (n - 1)) == 0) return static_cast<float>(sum) * (1.0f / static_cast<float>(n));
    return sum / n;
  }
  bool matches(ReduceOp op, double x, double want) const {
    if (op != ReduceOp::kAvg || (n & (n - 1)) == 0) return x == want;
    return std::fabs(x - want) <= std::fabs(want) * std::ldexp(1.0, -22);
  }
};

// One array of a case, of fp32 or bf16 elements: ordinary memory, or Communicator::allocateBuffer
// (`allocate`, which every rank of a job calls alike; `use` says whether this rank uses it).
class Array {
 public:
  Array() = default;
  Array(Communicator& comm, bool allocate, bool use, size_t len, DType dtype, float fill) : dtype_(dtype) {
    const size_t floats = dtype == DType::kBF16 ? (len + 1) / 2 : len;
    if (allocate) buffer_ = comm.allocateBuffer(floats);
    if (use) {
      data_ = buffer_->data();
    } else {
      vector_.resize(floats);
      data_ = vector_.data();
    }
    for (size_t i = 0; i < len; ++i) set(i, fill);
  }
  void* data() const { return data_; }
  // Element i's address (NCCL's in place points into the middle of an array).
  void* at(size_t i) const { return reinterpret_cast<char*>(data_) + i * cohort::runtime::sizeOf(dtype_); }
  float get(size_t i) const {
    if (dtype_ == DType::kF32) return data_[i];
    return cohort::runtime::toFloat({reinterpret_cast<const uint16_t*>(data_)[i]});
  }
  void set(size_t i, float v) {
    if (dtype_ == DType::kF32) {
      data_[i] = v;
    } else {
      reinterpret_cast<uint16_t*>(data_)[i] = cohort::runtime::toBf16(v).bits;
    }
  }

 private:
  cohort::collectives::BufferPtr buffer_;
  std::vector<float> vector_;
  float* data_ = nullptr;
  DType dtype_ = DType::kF32;
};

class Suite {
 public:
  Suite(Communicator& comm, std::chrono::milliseconds timeout, const std::string& buffers)
      : comm_(comm),
        rank_(comm.rank()),
        n_(comm.size()),
        ref_{comm.size()},
        timeout_(timeout),
        allocate_(buffers != "user"),
        shared_(buffers == "shared" || (buffers == "mixed" && rank_ % 2 == 0)) {}

  int failures() const { return failures_; }

  void run() {
    const size_t n = static_cast<size_t>(n_);
    const size_t counts[] = {0, 1, 7, 13 * n + 5, 1000003, (size_t{1} << 20) + 3};
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      dtype_ = dtype;
      for (size_t count : counts) {
        if (dtype == DType::kBF16 && count > 1000003) continue;  // the sizes' paths are covered by fp32
        for (bool inPlace : {false, true}) {
          allReduce(count, inPlace);
          reduceScatter(count, inPlace);
          allGather(count, inPlace);
        }
        for (int root = 0; root < n_; ++root) broadcast(count, root);
        comm_.barrier()->wait(timeout_);
      }
    }
    dtype_ = DType::kF32;
  }

  // The element type, by name, in this suite's failure lines.
  std::string typed(const std::string& what) const { return dtype_ == DType::kBF16 ? what + " bf16" : what; }

 private:
  // Reports the first wrong element of one case (one line) and counts the case as failed.
  template <class Expected>
  void check(const std::string& what, size_t count, bool inPlace, const Array& got, size_t offset, size_t len,
             Expected expected, ReduceOp op = ReduceOp::kSum) {
    for (size_t i = 0; i < len; ++i) {
      double want = expected(i);
      // bf16: the fp32 result rounded once (exact for sums of these values; avg within bf16's step).
      if (dtype_ == DType::kBF16) want = cohort::runtime::roundToBf16(static_cast<float>(want));
      const float x = got.get(offset + i);
      if (dtype_ == DType::kBF16 && op == ReduceOp::kAvg ? std::fabs(x - want) <= std::fabs(want) * std::ldexp(1.0, -8)
                                                         : ref_.matches(op, x, want)) {
        continue;
      }
      std::printf("rank %d: %s count %zu %s: element %zu = %.9g, expected %.9g\n", rank_, typed(what).c_str(), count,
                  inPlace ? "in-place" : "out-of-place", i, static_cast<double>(x), want);
      ++failures_;
      return;
    }
  }

  Array filled(size_t len, float v) { return Array(comm_, allocate_, shared_, len, dtype_, v); }
  Array values(size_t len, int rank) {
    Array a = filled(len, 0.0f);
    for (size_t i = 0; i < len; ++i) a.set(i, value(rank, i));
    return a;
  }

  void allReduce(size_t count, bool inPlace) {
    const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};
    std::vector<Array> in(4), out(4);
    std::vector<cohort::collectives::WorkPtr> works;
    for (int k = 0; k < 4; ++k) {  // all four issued before the first wait
      in[k] = values(count, rank_);
      if (!inPlace) out[k] = filled(count, std::nanf(""));
      void* dst = inPlace ? in[k].data() : out[k].data();
      works.push_back(comm_.allReduce(in[k].data(), dst, count, {.op = ops[k], .dtype = dtype_}));
    }
    for (int k = 0; k < 4; ++k) {
      works[k]->wait(timeout_);
      check(
          std::string("allreduce(") + cohort::collectives::toString(ops[k]) + ")", count, inPlace,
          inPlace ? in[k] : out[k], 0, count, [&](size_t i) { return ref_.expect(ops[k], i); }, ops[k]);
    }
  }

  void reduceScatter(size_t countPerRank, bool inPlace) {
    const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};
    const size_t total = countPerRank * static_cast<size_t>(n_);
    const size_t offset = static_cast<size_t>(rank_) * countPerRank;
    for (ReduceOp op : ops) {
      Array in = values(total, rank_);
      Array out = inPlace ? Array() : filled(countPerRank, std::nanf(""));
      void* dst = inPlace ? in.at(offset) : out.data();  // in place: this rank's chunk of the input
      comm_.reduceScatter(in.data(), dst, countPerRank, {.op = op, .dtype = dtype_})->wait(timeout_);
      check(
          std::string("reducescatter(") + cohort::collectives::toString(op) + ")", countPerRank, inPlace,
          inPlace ? in : out, inPlace ? offset : 0, countPerRank, [&](size_t i) { return ref_.expect(op, offset + i); },
          op);
    }
  }

  void allGather(size_t countPerRank, bool inPlace) {
    const size_t total = countPerRank * static_cast<size_t>(n_);
    Array out = filled(total, std::nanf(""));
    Array in = values(countPerRank, rank_);
    const void* src = in.data();
    if (inPlace) {  // this rank's input at its chunk of the output
      const size_t offset = static_cast<size_t>(rank_) * countPerRank;
      for (size_t i = 0; i < countPerRank; ++i) out.set(offset + i, value(rank_, i));
      src = out.at(offset);
    }
    comm_.allGather(src, out.data(), countPerRank, {.dtype = dtype_})->wait(timeout_);
    check("allgather", countPerRank, inPlace, out, 0, total,
          [&](size_t i) { return static_cast<double>(value(static_cast<int>(i / countPerRank), i % countPerRank)); });
  }

  void broadcast(size_t count, int root) {
    Array data = filled(count, -1.0f);
    for (size_t i = 0; i < count && rank_ == root; ++i) data.set(i, value(root, i));
    comm_.broadcast(data.data(), count, {.root = root, .dtype = dtype_})->wait(timeout_);
    check("broadcast(root " + std::to_string(root) + ")", count, true, data, 0, count,
          [&](size_t i) { return static_cast<double>(value(root, i)); });
  }

  Communicator& comm_;
  int rank_;
  int n_;
  Reference ref_;
  std::chrono::milliseconds timeout_;
  bool allocate_;
  bool shared_;
  DType dtype_ = DType::kF32;
  int failures_ = 0;
};

// Rank 1 issues an all-reduce of `count` elements in bf16 where the others issue fp32: every rank
// must throw InvalidArgument naming both element types before any data moves (1000 elements, and
// 2^17, which the hierarchical backend reduces in two levels). Leaves the communicator broken, so
// it comes last. Returns the failures.
int checkDtypeMismatch(Communicator& comm, size_t count, std::chrono::milliseconds timeout) {
  if (comm.size() < 2 || comm.backend() == "nccl") return 0;  // nccl compares no fingerprints
  std::vector<float> data(count, 1.0f);
  const DType dtype = comm.rank() == 1 ? DType::kBF16 : DType::kF32;
  try {
    comm.allReduce(data.data(), data.data(), data.size(), {.dtype = dtype})->wait(timeout);
  } catch (const cohort::InvalidArgument& e) {
    const std::string message = e.what();
    const std::string elements = std::to_string(count) + " elements)";
    if (message.find("allreduce(sum, float32, " + elements) != std::string::npos &&
        message.find("allreduce(sum, bfloat16, " + elements) != std::string::npos) {
      return 0;
    }
    std::printf("rank %d: dtype mismatch: the message names not both fingerprints: %s\n", comm.rank(), e.what());
    return 1;
  }
  std::printf("rank %d: dtype mismatch: not detected\n", comm.rank());
  return 1;
}

// --simulate-nodes K: the ranks as K nodes of consecutive ranks, each with a job id of its own (so
// each node's shared-memory segments are its own).
cohort::runtime::WorldInfo simulateNodes(cohort::runtime::WorldInfo world, int nodes) {
  if (nodes <= 1) return world;
  if (world.worldSize % nodes != 0) {
    throw cohort::InvalidArgument("--simulate-nodes " + std::to_string(nodes) + " does not divide " +
                                  std::to_string(world.worldSize) + " ranks");
  }
  const int perNode = world.worldSize / nodes;
  world.localWorldSize = perNode;
  world.localRank = world.rank % perNode;
  world.jobId += "-node" + std::to_string(world.rank / perNode);
  return world;
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend;
  long timeoutMs = 60000;
  std::string buffers = "user";
  int nodes = 1;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--backend" && i + 1 < argc) {
      backend = argv[++i];
    } else if (arg == "--simulate-nodes" && i + 1 < argc) {
      nodes = std::atoi(argv[++i]);
    } else if (arg == "--timeout-ms" && i + 1 < argc) {
      timeoutMs = std::atol(argv[++i]);
    } else if (arg == "--buffers" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "user" || std::string(argv[i + 1]) == "shared" ||
                std::string(argv[i + 1]) == "mixed")) {
      buffers = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: conformance_worker --backend NAME [--timeout-ms MS] [--buffers user|shared|mixed] "
                   "[--simulate-nodes K]\n");
      return 2;
    }
  }
  try {
    const auto timeout = std::chrono::milliseconds(timeoutMs);
    auto world = simulateNodes(cohort::runtime::WorldInfo::detect(), nodes);
    auto comm = cohort::collectives::makeCommunicator({.backend = backend, .world = world, .timeout = timeout});
    const auto start = Clock::now();
    Suite suite(*comm, timeout, buffers);
    suite.run();
    int failures = suite.failures();
    failures += cohort::collectives::testing::checkSplit(*comm, world, timeout);
    {  // a communicator of its own, which the mismatch breaks
      auto second = cohort::collectives::makeCommunicator({.backend = backend, .world = world, .timeout = timeout});
      failures += checkDtypeMismatch(*second, size_t{1} << 17, timeout);
    }
    failures += checkDtypeMismatch(*comm, 1000, timeout);
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("rank %d: conformance %s on %d ranks, %s buffers: %d failure(s), %.2f s\n", comm->rank(),
                comm->backend().c_str(), comm->size(), buffers.c_str(), failures, secs);
    return failures == 0 ? 0 : 1;
  } catch (const cohort::Error& e) {
    std::fprintf(stderr, "conformance_worker: %s\n", e.what());
    return static_cast<int>(e.code());
  }
}
