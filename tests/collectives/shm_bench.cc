// A quick all-reduce benchmark for developing the shm backend (the official one is
// `cohort bench allreduce`). Prints, on rank 0, size, time per all-reduce and busbw = algbw *
// 2(n-1)/n, like nccl-tests, for 4 KiB ... 256 MiB, in place.
//
//   cohortrun --nproc-per-node 2 -- shm_bench [--backend shm] [--max-bytes N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/communicator.h"  // Communicator, makeCommunicator
#include "runtime/error.h"             // cohort::Error
#include "runtime/world_info.h"        // WorldInfo::detect

int main(int argc, char** argv) {
  std::string backend = "shm";
  size_t maxBytes = size_t{256} << 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--backend") backend = argv[i + 1];
    if (flag == "--max-bytes") maxBytes = std::strtoull(argv[i + 1], nullptr, 10);
  }
  try {
    const auto timeout = std::chrono::seconds(120);
    auto comm = cohort::collectives::makeCommunicator(
        {.backend = backend, .world = cohort::runtime::WorldInfo::detect(), .timeout = timeout});
    const int n = comm->size();
    std::vector<float> buffer(maxBytes / sizeof(float), 1.0f);
    {
      for (int i = 0; i < 100; ++i) comm->barrier()->wait(timeout);
      auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < 2000; ++i) comm->barrier()->wait(timeout);
      double us = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 2000 * 1e6;
      if (comm->rank() == 0) std::printf("barrier %.2f us\n", us);
    }
    if (comm->rank() == 0) std::printf("%12s %12s %10s %10s\n", "bytes", "time_us", "algbw", "busbw");
    for (size_t bytes = 4096; bytes <= maxBytes; bytes *= 4) {
      const size_t count = bytes / sizeof(float);
      const int iters = static_cast<int>(std::clamp<size_t>((size_t{1} << 30) / bytes, 5, 2000));
      for (int i = 0; i < 3; ++i) comm->allReduce(buffer.data(), buffer.data(), count, {})->wait(timeout);
      comm->barrier()->wait(timeout);
      auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) comm->allReduce(buffer.data(), buffer.data(), count, {})->wait(timeout);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
      double algbw = static_cast<double>(bytes) / secs / 1e9;
      if (comm->rank() == 0) {
        std::printf("%12zu %12.1f %10.2f %10.2f\n", bytes, secs * 1e6, algbw, algbw * 2.0 * (n - 1) / n);
      }
      std::fill(buffer.begin(), buffer.end(), 1.0f);  // keep values small and finite
    }
    return 0;
  } catch (const cohort::Error& e) {
    std::fprintf(stderr, "shm_bench: %s\n", e.what());
    return static_cast<int>(e.code());
  }
}
