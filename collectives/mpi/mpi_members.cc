#include "collectives/mpi/mpi_members.h"

#include <unistd.h>  // gethostname

#include <cstdint>
#include <cstring>
#include <sstream>
#include <thread>

#include "collectives/mpi/mpi_environment.h"
#include "runtime/error.h"

namespace cohort::collectives::mpi_detail {
namespace {

// One member's record as sent: fixed size, raw bytes (the same binary on every node).
struct WireMember {
  int32_t worldRank = -1;
  char host[256] = {};  // NUL-terminated (HOST_NAME_MAX is 64 on Linux)
};

}  // namespace

std::vector<Member> gatherMembers(MPI_Comm comm, int worldRank, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  int size = 0;
  checkMpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  WireMember self;
  self.worldRank = worldRank;
  if (gethostname(self.host, sizeof(self.host) - 1) != 0) std::strcpy(self.host, "unknown host");
  std::vector<WireMember> all(static_cast<size_t>(size));
  MPI_Request request = MPI_REQUEST_NULL;
  checkMpi(
      MPI_Iallgather(&self, sizeof(WireMember), MPI_BYTE, all.data(), sizeof(WireMember), MPI_BYTE, comm, &request),
      "MPI_Iallgather (host names)");
  const Clock::time_point deadline = Clock::now() + timeout;
  for (;;) {
    int done = 0;
    checkMpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Iallgather (host names)");
    if (done) break;
    if (Clock::now() >= deadline) {
      MpiEnvironment::acquire().markUnclean();
      COHORT_THROW(TimeoutError) << "mpi backend: not every rank sent its host name within "
                                 << static_cast<double>(timeout.count()) / 1000 << " s (rank " << worldRank << " on "
                                 << self.host << " waited)";
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::vector<Member> members(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    all[r].host[sizeof(all[r].host) - 1] = '\0';
    members[r] = {all[r].worldRank, all[r].host};
  }
  int worldSize = 0;
  checkMpi(MPI_Comm_size(MPI_COMM_WORLD, &worldSize), "MPI_Comm_size");
  MpiEnvironment::acquire().noteCommunicator(timeout, members, worldSize);  // for the end of the job
  return members;
}

std::string describeMembers(const std::vector<Member>& members, const std::vector<int>& commRanks) {
  std::ostringstream os;
  os << (commRanks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < commRanks.size(); ++i) {
    const Member& m = members.at(static_cast<size_t>(commRanks[i]));
    os << (i ? ", " : "") << m.worldRank << " (" << m.host << ")";
  }
  return os.str();
}

}  // namespace cohort::collectives::mpi_detail
