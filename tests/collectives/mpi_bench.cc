// A quick all-reduce timing of the mpi backend, measured the way the peer benchmark
// bench-peers/w1_allreduce_mpi.cpp measures raw MPI_Allreduce, so the two compare directly and the
// difference is the fingerprint round (and Work polling). Not a test.
//
//   mpirun -np 2 mpi_bench [--sizes 4096,1048576,...]
// Per size: 5 warm-up and I timed ops (I = 200 up to 64 KiB, 50 for 1 MiB, 20 above); each op:
// barrier; t0; allReduce(sum, out of place)->wait; t1; time = max over ranks; the median is printed.
// time_b2b: I ops back to back without barriers, average. Size 0 shows the fixed per-collective cost.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/mpi/mpi_communicator.h"
#include "runtime/error.h"
#include "runtime/world_info.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kTimeout{60000};

double maxOverRanks(cohort::collectives::Communicator& comm, double seconds) {
  float value = static_cast<float>(seconds);
  comm.allReduce(&value, &value, 1, {.op = cohort::collectives::ReduceOp::kMax})->wait(kTimeout);
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes = {0, 4u << 10, 1u << 20, 16u << 20, 64u << 20};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) != "--sizes") continue;
    sizes.clear();
    std::string list = argv[i + 1];
    for (size_t p = 0; p <= list.size();) {
      size_t q = list.find(',', p);
      if (q == std::string::npos) q = list.size();
      sizes.push_back(std::stoull(list.substr(p, q - p)));
      p = q + 1;
    }
  }
  try {
    auto world = cohort::runtime::WorldInfo::detect();
    auto comm = cohort::collectives::makeMpiCommunicator({.backend = "mpi", .world = world, .timeout = kTimeout});
    const int n = comm->size();
    const size_t maxBytes = *std::max_element(sizes.begin(), sizes.end());
    std::vector<float> input(maxBytes / sizeof(float), static_cast<float>(comm->rank() + 1));
    std::vector<float> output(input.size());
    for (size_t bytes : sizes) {
      const size_t count = bytes / sizeof(float);
      const int iters = bytes <= (64u << 10) ? 200 : bytes <= (1u << 20) ? 50 : 20;
      std::vector<double> times;
      for (int it = 0; it < 5 + iters; ++it) {
        comm->barrier()->wait(kTimeout);
        const auto t0 = Clock::now();
        comm->allReduce(input.data(), output.data(), count, {})->wait(kTimeout);
        const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        const double worst = maxOverRanks(*comm, dt);
        if (it >= 5) times.push_back(worst);
      }
      comm->barrier()->wait(kTimeout);
      const auto b0 = Clock::now();
      for (int it = 0; it < iters; ++it) comm->allReduce(input.data(), output.data(), count, {})->wait(kTimeout);
      const double b2b = maxOverRanks(*comm, std::chrono::duration<double>(Clock::now() - b0).count()) / iters;
      const bool ok = count == 0 || (output[0] == n * (n + 1) / 2 && output[count - 1] == n * (n + 1) / 2);
      std::sort(times.begin(), times.end());
      const double median = times[times.size() / 2];
      if (comm->rank() == 0) {
        std::printf(
            "RESULT bench=mpi_backend_allreduce ranks=%d bytes=%zu time_us=%.2f min_us=%.2f time_b2b_us=%.2f "
            "check=%s\n",
            n, bytes, median * 1e6, times.front() * 1e6, b2b * 1e6, ok ? "ok" : "FAIL");
        std::fflush(stdout);
      }
    }
    return 0;
  } catch (const cohort::Error& e) {
    std::fprintf(stderr, "mpi_bench: %s\n", e.what());
    return static_cast<int>(e.code());
  }
}
