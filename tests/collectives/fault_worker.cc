// A worker that makes one rank misbehave in a collective, for the failure tests
// (shm_failure_test.cc). Backend-agnostic; every rank runs three good all-reduces (#0-#2) first.
//
//   fault_worker --backend shm --mode M [--timeout-ms MS]
// Modes (the bad rank is rank 1):
//   mismatch-count  #3 is an all-reduce of 1000 elements, but 999 on rank 1
//   mismatch-kind   #3 is an all-reduce on every rank but a broadcast from root 0 on rank 1
//   kill            #3 is a large all-reduce; rank 1 SIGKILLs itself while it runs
//   kill-shared     the same on buffers from allocateBuffer (the shm backend's direct path)
//   alloc-mismatch  allocateBuffer(1000), but 999 on rank 1
//   skip            rank 1 never issues #3 (it sleeps past the others' timeout, then exits 0)
// Exits with the cohort exit code of the error a rank saw (2 mismatch, 3 timeout, 4 peer), after
// printing "fault_worker: <message>" on stderr; 0 when nothing failed.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"  // Communicator, makeCommunicator
#include "runtime/error.h"             // cohort::Error and its exit codes
#include "runtime/world_info.h"        // WorldInfo::detect

namespace {

using cohort::collectives::Communicator;

void runFault(Communicator& comm, const std::string& mode, std::chrono::milliseconds timeout) {
  const bool bad = comm.rank() == 1;
  std::vector<float> data(1000, 1.0f);
  for (int i = 0; i < 3; ++i) comm.allReduce(data.data(), data.data(), data.size(), {})->wait(timeout);
  if (mode == "mismatch-count") {
    comm.allReduce(data.data(), data.data(), bad ? 999 : 1000, {})->wait(timeout);
  } else if (mode == "mismatch-kind") {
    auto work = bad ? comm.broadcast(data.data(), 1000, 0) : comm.allReduce(data.data(), data.data(), 1000, {});
    work->wait(timeout);
  } else if (mode == "kill" || mode == "kill-shared") {
    const size_t count = size_t{32} << 20;  // 128 MiB: long enough to be killed inside it
    std::vector<float> big;
    cohort::collectives::BufferPtr shared;
    float* p = nullptr;
    if (mode == "kill") {
      big.assign(count, 1.0f);
      p = big.data();
    } else {
      shared = comm.allocateBuffer(count);
      p = shared->data();
      std::fill_n(p, count, 1.0f);
    }
    auto work = comm.allReduce(p, p, count, {});
    if (bad) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      raise(SIGKILL);
    }
    work->wait(timeout);
  } else if (mode == "alloc-mismatch") {
    auto buffer = comm.allocateBuffer(bad ? 999 : 1000);
  } else if (mode == "skip") {
    if (bad) {
      std::this_thread::sleep_for(timeout * 3);
      return;
    }
    comm.allReduce(data.data(), data.data(), 1000, {})->wait(timeout);
  } else {
    COHORT_THROW(InvalidArgument) << "unknown --mode '" << mode << "'";
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend;
  std::string mode;
  long timeoutMs = 10000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--backend")
      backend = argv[i + 1];
    else if (flag == "--mode")
      mode = argv[i + 1];
    else if (flag == "--timeout-ms")
      timeoutMs = std::atol(argv[i + 1]);
  }
  try {
    const auto timeout = std::chrono::milliseconds(timeoutMs);
    auto comm = cohort::collectives::makeCommunicator(
        {.backend = backend, .world = cohort::runtime::WorldInfo::detect(), .timeout = timeout});
    runFault(*comm, mode, timeout);
    return 0;
  } catch (const cohort::Error& e) {
    std::fprintf(stderr, "fault_worker: %s\n", e.what());
    std::fflush(stderr);
    return static_cast<int>(e.code());
  }
}
