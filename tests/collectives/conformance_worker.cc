// The collectives conformance worker: one process of a job that runs every Communicator operation
// and checks the results exactly. Backend-agnostic (only the Communicator interface and
// makeCommunicator()), so the same program runs under cohortrun (shm) and mpirun (mpi).
//
//   cohortrun --nproc-per-node 3 -- conformance_worker --backend shm [--timeout-ms 60000]
//       [--buffers user|shared|mixed]
//
// Covers: allReduce (sum, avg, max, min), reduceScatter (same ops), allGather, broadcast from every
// root, barrier; each out of place and in place (input == output, as communicator.h defines it:
// for reduceScatter the result lands at the start of the input, for allGather this rank's input is
// the first countPerRank elements of the output); counts 0, 1, 7, 13*n+5 (not divisible by n),
// 1000003 and 2^20+3; several collectives issued before the first wait. Buffers are ordinary memory
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

#include "collectives/communicator.h"  // Communicator, makeCommunicator
#include "runtime/error.h"             // cohort::Error and its exit codes
#include "runtime/world_info.h"        // WorldInfo::detect

namespace {

using cohort::collectives::Communicator;
using cohort::collectives::ReduceOp;
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

// One float array of a case, filled with `fill`: ordinary memory, or Communicator::allocateBuffer
// (`allocate`, which every rank of a job calls alike; `use` says whether this rank uses it).
class Array {
 public:
  Array() = default;
  Array(Communicator& comm, bool allocate, bool use, size_t len, float fill) {
    if (allocate) buffer_ = comm.allocateBuffer(len);
    if (use) {
      data_ = buffer_->data();
    } else {
      vector_.resize(len);
      data_ = vector_.data();
    }
    std::fill_n(data_, len, fill);
  }
  float* data() const { return data_; }

 private:
  cohort::collectives::BufferPtr buffer_;
  std::vector<float> vector_;
  float* data_ = nullptr;
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
    for (size_t count : counts) {
      for (bool inPlace : {false, true}) {
        allReduce(count, inPlace);
        reduceScatter(count, inPlace);
        allGather(count, inPlace);
      }
      for (int root = 0; root < n_; ++root) broadcast(count, root);
      comm_.barrier()->wait(timeout_);
    }
  }

 private:
  // Reports the first wrong element of one case (one line) and counts the case as failed.
  template <class Expected>
  void check(const std::string& what, size_t count, bool inPlace, const float* got, size_t len, Expected expected,
             ReduceOp op = ReduceOp::kSum) {
    for (size_t i = 0; i < len; ++i) {
      double want = expected(i);
      if (ref_.matches(op, got[i], want)) continue;
      std::printf("rank %d: %s count %zu %s: element %zu = %.9g, expected %.9g\n", rank_, what.c_str(), count,
                  inPlace ? "in-place" : "out-of-place", i, static_cast<double>(got[i]), want);
      ++failures_;
      return;
    }
  }

  Array filled(size_t len, float v) { return Array(comm_, allocate_, shared_, len, v); }
  Array values(size_t len, int rank) {
    Array a = filled(len, 0.0f);
    for (size_t i = 0; i < len; ++i) a.data()[i] = value(rank, i);
    return a;
  }

  void allReduce(size_t count, bool inPlace) {
    const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};
    std::vector<Array> in(4), out(4);
    std::vector<cohort::collectives::WorkPtr> works;
    for (int k = 0; k < 4; ++k) {  // all four issued before the first wait
      in[k] = values(count, rank_);
      if (!inPlace) out[k] = filled(count, std::nanf(""));
      float* dst = inPlace ? in[k].data() : out[k].data();
      works.push_back(comm_.allReduce(in[k].data(), dst, count, {.op = ops[k]}));
    }
    for (int k = 0; k < 4; ++k) {
      works[k]->wait(timeout_);
      const float* got = inPlace ? in[k].data() : out[k].data();
      check(
          std::string("allreduce(") + cohort::collectives::toString(ops[k]) + ")", count, inPlace, got, count,
          [&](size_t i) { return ref_.expect(ops[k], i); }, ops[k]);
    }
  }

  void reduceScatter(size_t countPerRank, bool inPlace) {
    const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};
    const size_t total = countPerRank * static_cast<size_t>(n_);
    const size_t offset = static_cast<size_t>(rank_) * countPerRank;
    for (ReduceOp op : ops) {
      Array in = values(total, rank_);
      Array out = inPlace ? Array() : filled(countPerRank, std::nanf(""));
      float* dst = inPlace ? in.data() : out.data();
      comm_.reduceScatter(in.data(), dst, countPerRank, op)->wait(timeout_);
      check(
          std::string("reducescatter(") + cohort::collectives::toString(op) + ")", countPerRank, inPlace, dst,
          countPerRank, [&](size_t i) { return ref_.expect(op, offset + i); }, op);
    }
  }

  void allGather(size_t countPerRank, bool inPlace) {
    const size_t total = countPerRank * static_cast<size_t>(n_);
    Array out = filled(total, std::nanf(""));
    Array in = values(countPerRank, rank_);
    const float* src = in.data();
    if (inPlace) {
      std::memcpy(out.data(), in.data(), countPerRank * sizeof(float));
      src = out.data();
    }
    comm_.allGather(src, out.data(), countPerRank)->wait(timeout_);
    check("allgather", countPerRank, inPlace, out.data(), total,
          [&](size_t i) { return static_cast<double>(value(static_cast<int>(i / countPerRank), i % countPerRank)); });
  }

  void broadcast(size_t count, int root) {
    Array data = filled(count, -1.0f);
    for (size_t i = 0; i < count && rank_ == root; ++i) data.data()[i] = value(root, i);
    comm_.broadcast(data.data(), count, root)->wait(timeout_);
    check("broadcast(root " + std::to_string(root) + ")", count, true, data.data(), count,
          [&](size_t i) { return static_cast<double>(value(root, i)); });
  }

  Communicator& comm_;
  int rank_;
  int n_;
  Reference ref_;
  std::chrono::milliseconds timeout_;
  bool allocate_;
  bool shared_;
  int failures_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string backend;
  long timeoutMs = 60000;
  std::string buffers = "user";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--backend" && i + 1 < argc) {
      backend = argv[++i];
    } else if (arg == "--timeout-ms" && i + 1 < argc) {
      timeoutMs = std::atol(argv[++i]);
    } else if (arg == "--buffers" && i + 1 < argc &&
               (std::string(argv[i + 1]) == "user" || std::string(argv[i + 1]) == "shared" ||
                std::string(argv[i + 1]) == "mixed")) {
      buffers = argv[++i];
    } else {
      std::fprintf(stderr, "usage: conformance_worker --backend NAME [--timeout-ms MS] [--buffers user|shared|mixed]\n");
      return 2;
    }
  }
  try {
    const auto timeout = std::chrono::milliseconds(timeoutMs);
    auto world = cohort::runtime::WorldInfo::detect();
    auto comm = cohort::collectives::makeCommunicator({.backend = backend, .world = world, .timeout = timeout});
    const auto start = Clock::now();
    Suite suite(*comm, timeout, buffers);
    suite.run();
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("rank %d: conformance %s on %d ranks, %s buffers: %d failure(s), %.2f s\n", comm->rank(),
                comm->backend().c_str(), comm->size(), buffers.c_str(), suite.failures(), secs);
    return suite.failures() == 0 ? 0 : 1;
  } catch (const cohort::Error& e) {
    std::fprintf(stderr, "conformance_worker: %s\n", e.what());
    return static_cast<int>(e.code());
  }
}
