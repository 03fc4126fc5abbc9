// A small program run under mpirun by mpi_smoke_test and mpi_mismatch_test: it checks every
// collective of the mpi backend with exact data, or provokes one error on purpose.
//
//   mpi_smoke_worker [--scenario ok|store|count-mismatch|injected-mismatch|kind-mismatch|missing-rank|finished-rank]
//   [--timeout-ms N]
// Prints "WORLD rank=R size=N source=S" first, "OK rank=R" on success; on a cohort::Error prints
// "[rank R] ERROR: <message>" to stderr and exits with its exit code (2 mismatch, 3 timeout).
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/mpi/mpi_communicator.h"
#include "collectives/mpi/mpi_store.h"
#include "runtime/error.h"
#include "runtime/world_info.h"

namespace {

using cohort::collectives::AllReduceOptions;
using cohort::collectives::Communicator;
using cohort::collectives::ReduceOp;

std::chrono::milliseconds gTimeout{30000};
int gFailures = 0;

void expectEqual(const std::vector<float>& got, const std::vector<float>& want, const std::string& what, int rank) {
  size_t wrong = 0;
  for (size_t i = 0; i < want.size(); ++i) wrong += got[i] != want[i];
  if (wrong == 0) return;
  ++gFailures;
  std::fprintf(stderr, "[rank %d] FAIL %s: %zu of %zu elements wrong\n", rank, what.c_str(), wrong, want.size());
}

// Rank r's element i: r + 1 + i % 13 (small integers: every reduction order is exact).
float value(int rank, size_t i) { return static_cast<float>(rank + 1 + static_cast<int>(i % 13)); }

float reduced(ReduceOp op, int n, size_t i) {
  const float base = static_cast<float>(i % 13);
  switch (op) {
    case ReduceOp::kSum:
      return n * base + n * (n + 1) / 2;
    case ReduceOp::kAvg:
      return (n * base + n * (n + 1) / 2) * (1.0f / static_cast<float>(n));
    case ReduceOp::kMax:
      return base + n;
    case ReduceOp::kMin:
      return base + 1;
  }
  return 0;
}

void checkAll(Communicator& comm) {
  const int rank = comm.rank();
  const int n = comm.size();
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000003}}) {
    for (bool inPlace : {false, true}) {
      const std::string tag = " count=" + std::to_string(count) + (inPlace ? " in-place" : " out-of-place");
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        std::vector<float> in(count), out(count, -1), want(count);
        for (size_t i = 0; i < count; ++i) in[i] = value(rank, i), want[i] = reduced(op, n, i);
        float* dst = inPlace ? in.data() : out.data();
        comm.allReduce(in.data(), dst, count, AllReduceOptions{.op = op})->wait(gTimeout);
        expectEqual(inPlace ? in : out, want, std::string("allreduce ") + toString(op) + tag, rank);

        std::vector<float> full(count * n), part(count, -1), wantPart(count);
        for (size_t i = 0; i < count * n; ++i) full[i] = value(rank, i);
        for (size_t i = 0; i < count; ++i) wantPart[i] = reduced(op, n, rank * count + i);
        // In place is NCCL's layout: this rank's chunk of the full buffer.
        float* rsOut = inPlace ? full.data() + rank * count : part.data();
        comm.reduceScatter(full.data(), rsOut, count, {.op = op})->wait(gTimeout);
        expectEqual(inPlace ? std::vector<float>(rsOut, rsOut + count) : part, wantPart,
                    std::string("reducescatter ") + toString(op) + tag, rank);
      }
      std::vector<float> mine(count * n, -1), gathered(count * n, -1), wantGathered(count * n);
      // In place is NCCL's layout: this rank's input at its chunk of the output.
      float* src = inPlace ? mine.data() + rank * count : mine.data();
      for (size_t i = 0; i < count; ++i) src[i] = value(rank, i);
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) wantGathered[r * count + i] = value(r, i);
      comm.allGather(src, inPlace ? mine.data() : gathered.data(), count, {})->wait(gTimeout);
      expectEqual(inPlace ? mine : gathered, wantGathered, "allgather" + tag, rank);

      const int root = n - 1;
      std::vector<float> data(count), wantData(count);
      for (size_t i = 0; i < count; ++i) data[i] = value(rank, i), wantData[i] = value(root, i);
      comm.broadcast(data.data(), count, root)->wait(gTimeout);
      expectEqual(data, wantData, "broadcast" + tag, rank);
    }
  }
  // Several collectives in flight at once, waited for in reverse order.
  std::vector<std::vector<float>> buffers(5, std::vector<float>(4096));
  std::vector<cohort::collectives::WorkPtr> works;
  for (auto& b : buffers) {
    for (size_t i = 0; i < b.size(); ++i) b[i] = value(rank, i);
    works.push_back(comm.allReduce(b.data(), b.data(), b.size(), {}));
  }
  for (size_t k = works.size(); k-- > 0;) works[k]->wait(gTimeout);
  std::vector<float> want(4096);
  for (size_t i = 0; i < want.size(); ++i) want[i] = reduced(ReduceOp::kSum, n, i);
  for (auto& b : buffers) expectEqual(b, want, "overlapped allreduce", rank);
  comm.barrier()->wait(gTimeout);
  // A collective nobody waits for: destroying the communicator finishes it, MPI still finalises.
  comm.barrier();
}

// The MPI rendezvous store beside a live communicator: every rank sets a binary value, waits for
// and reads everyone's (rank 0's is 1 MiB), check() on present and absent keys, a get that times out
// naming its key, then a collective on the communicator still works.
void checkStore(Communicator& comm) {
  const int rank = comm.rank(), n = comm.size();
  cohort::collectives::MpiStore store(gTimeout);
  auto valueOf = [](int r) {
    std::vector<uint8_t> v(r == 0 ? size_t{1} << 20 : static_cast<size_t>(1000 * r + 1));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>((i * 7 + static_cast<size_t>(r)) % 256);
    return v;
  };
  store.set("rank" + std::to_string(rank), valueOf(rank));
  std::vector<std::string> keys;
  for (int r = 0; r < n; ++r) keys.push_back("rank" + std::to_string(r));
  store.wait(keys, gTimeout);
  if (!store.check(keys) || store.check({"rank0", "nobody"})) {
    ++gFailures;
    std::fprintf(stderr, "[rank %d] FAIL store check\n", rank);
  }
  for (int r = 0; r < n; ++r) {
    if (store.get(keys[static_cast<size_t>(r)], gTimeout) != valueOf(r)) {
      ++gFailures;
      std::fprintf(stderr, "[rank %d] FAIL store value of rank %d\n", rank, r);
    }
  }
  try {
    store.get("nobody", std::chrono::milliseconds(200));
    ++gFailures;
    std::fprintf(stderr, "[rank %d] FAIL store get of a missing key returned\n", rank);
  } catch (const cohort::TimeoutError& e) {
    std::printf("STORE-TIMEOUT rank=%d %s\n", rank, e.what());
  }
  std::vector<float> buffer(1000, 1.0f);
  comm.allReduce(buffer.data(), buffer.data(), buffer.size(), {})->wait(gTimeout);
  expectEqual(buffer, std::vector<float>(1000, static_cast<float>(n)), "allreduce beside the store", rank);
}

int run(const std::string& scenario) {
  const cohort::runtime::WorldInfo world = cohort::runtime::WorldInfo::detect();
  std::printf("WORLD rank=%d size=%d source=%s\n", world.rank, world.worldSize, world.source.c_str());
  std::fflush(stdout);
  cohort::collectives::CommunicatorOptions options{.backend = "mpi", .world = world, .timeout = gTimeout};
  // The last rank issues its collective #1 with one element fewer (CommunicatorOptions::FaultInjection).
  if (scenario == "injected-mismatch") options.faultInjection = {.rank = world.worldSize - 1, .mismatchAt = 1};
  auto comm = cohort::collectives::makeMpiCommunicator(options);
  const int rank = comm->rank();
  const int last = comm->size() - 1;
  std::vector<float> buffer(1000, 1.0f);
  if (scenario == "ok") {
    checkAll(*comm);
  } else if (scenario == "store") {
    checkStore(*comm);
  } else if (scenario == "count-mismatch" || scenario == "injected-mismatch") {
    comm->barrier()->wait(gTimeout);
    const size_t count = rank == last && scenario == "count-mismatch" ? 999 : 1000;
    comm->allReduce(buffer.data(), buffer.data(), count, {})->wait(gTimeout);
  } else if (scenario == "kind-mismatch") {
    if (rank == 0)
      comm->broadcast(buffer.data(), buffer.size(), 0)->wait(gTimeout);
    else
      comm->allReduce(buffer.data(), buffer.data(), buffer.size(), {})->wait(gTimeout);
  } else if (scenario == "missing-rank") {
    comm->barrier()->wait(gTimeout);
    if (rank != last) {
      comm->allReduce(buffer.data(), buffer.data(), buffer.size(), {})->wait(gTimeout);
    } else {
      // Never comes to the collective: alive but elsewhere for twice the others' timeout, so that
      // they time out and mpirun ends the job while it sleeps. (Returning at once would put it in
      // MPI_Finalize's fence while mpirun aborts the job, which under load sometimes left mpirun
      // waiting past the test's 60 s: Open MPI's, a separate problem.)
      std::this_thread::sleep_for(2 * gTimeout);
      return 0;
    }
  } else if (scenario == "finished-rank") {
    // The last rank is done while the others still wait for it in a collective: it leaves at once,
    // into MPI_Finalize, and the others fail when their wait runs out.
    comm->barrier()->wait(gTimeout);
    if (rank != last) comm->allReduce(buffer.data(), buffer.data(), buffer.size(), {})->wait(gTimeout);
    std::printf("FINISHED rank=%d\n", rank);
    std::fflush(stdout);
    return 0;
  } else {
    throw cohort::InvalidArgument("unknown --scenario " + scenario);
  }
  if (gFailures > 0) return 1;
  std::printf("OK rank=%d\n", rank);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string scenario = "ok";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--scenario") == 0)
      scenario = argv[i + 1];
    else if (std::strcmp(argv[i], "--timeout-ms") == 0)
      gTimeout = std::chrono::milliseconds(std::stol(argv[i + 1]));
  }
  try {
    return run(scenario);
  } catch (const cohort::Error& e) {
    std::fprintf(stderr, "[rank %s] ERROR: %s\n", cohort::runtime::rankForMessages().c_str(), e.what());
    return static_cast<int>(e.code());
  }
}
