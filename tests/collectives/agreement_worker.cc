// Run under mpirun by agreement_test: every rank calls collectives::compareAcrossRanks over the
// transport named and prints what it learned.
//
//   agreement_worker --transport shm|mpi --scenario same|differ|absent [--timeout-ms N]
//     same    every rank holds "settings of the job"
//     differ  ranks 2 and up (or rank 1 in a world of 2) hold "settings of rank R"
//     absent  rank 1 never takes part (it waits in MPI_Barrier until mpirun ends the job)
// Prints "WORLD rank=R size=N", then "AGREED rank=R" or
// "DIFFER rank=R first=F count=C reference=<rank 0's> differing=<F's> hosts=<0's>,<F's>"; on a cohort::Error
// "ERROR rank=R <message>" and exits with its exit code.
#include <openmpi/mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "collectives/agreement.h"
#include "collectives/mpi/mpi_environment.h"
#include "runtime/error.h"
#include "runtime/world_info.h"

int main(int argc, char** argv) {
  using namespace cohort;
  std::string transport = "shm", scenario = "same";
  long timeoutMs = 30000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--transport")) transport = argv[i + 1];
    if (!std::strcmp(argv[i], "--scenario")) scenario = argv[i + 1];
    if (!std::strcmp(argv[i], "--timeout-ms")) timeoutMs = std::stol(argv[i + 1]);
  }
  const runtime::WorldInfo world = runtime::WorldInfo::detect();
  std::printf("WORLD rank=%d size=%d\n", world.rank, world.worldSize);
  std::fflush(stdout);
  if (scenario == "absent" && world.rank == 1) {
    collectives::mpi_detail::MpiEnvironment::acquire();
    MPI_Barrier(MPI_COMM_WORLD);  // never completes: the others fail and mpirun ends the job
    return 0;
  }
  std::string mine = "settings of the job";
  const int firstOdd = world.worldSize == 2 ? 1 : 2;
  if (scenario == "differ" && world.rank >= firstOdd) mine = "settings of rank " + std::to_string(world.rank);
  try {
    const collectives::Comparison c = collectives::compareAcrossRanks(
        mine, {.world = world,
               .timeout = std::chrono::milliseconds(timeoutMs),
               .name = "agreement-test",
               .transport = transport == "mpi" ? collectives::AgreementTransport::kMpi
                                               : collectives::AgreementTransport::kSharedMemory});
    if (c.firstDiffering < 0) {
      std::printf("AGREED rank=%d reference=%s\n", world.rank, c.reference.c_str());
    } else {
      std::printf("DIFFER rank=%d first=%d count=%d reference=%s differing=%s hosts=%s,%s\n", world.rank, c.firstDiffering,
                  c.differingRanks, c.reference.c_str(), c.differing.c_str(), c.referenceHost.c_str(), c.differingHost.c_str());
    }
    std::fflush(stdout);
    return 0;
  } catch (const Error& e) {
    std::printf("ERROR rank=%d %s\n", world.rank, e.what());
    std::fflush(stdout);
    return static_cast<int>(e.code());
  }
}
