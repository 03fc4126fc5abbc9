#include "collectives/agreement.h"

#include <unistd.h>  // gethostname

#include <openmpi/mpi.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "collectives/mpi/mpi_environment.h"
#include "ipc/backoff.h"
#include "ipc/job_segment.h"
#include "ipc/rank_roster.h"
#include "runtime/digest.h"
#include "runtime/error.h"

namespace cohort::collectives {

namespace {

using Clock = std::chrono::steady_clock;

double secondsOf(std::chrono::milliseconds d) { return static_cast<double>(d.count()) / 1000.0; }

std::string thisHost() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown host";
  return host;
}

// Each rank's exchange area: the length, then the bytes.
constexpr size_t kAreaFloats = (sizeof(uint32_t) + kMaxAgreementBytes + sizeof(float) - 1) / sizeof(float);

Comparison overSharedMemory(std::string_view mine, const AgreementOptions& o) {
  const runtime::WorldInfo& w = o.world;
  ipc::JobSegment segment({.jobId = w.jobId,
                           .localRank = w.localRank,
                           .localWorldSize = w.localWorldSize,
                           .exchangeFloatsPerRank = kAreaFloats,
                           .generation = w.restartCount,
                           .timeout = o.timeout,
                           .unlinkOnDestroy = true,  // also when the barrier fails: nothing left in /dev/shm
                           .name = o.name});
  auto* area = reinterpret_cast<unsigned char*>(segment.exchange(w.localRank));
  const auto length = static_cast<uint32_t>(mine.size());
  std::memcpy(area, &length, sizeof length);
  std::memcpy(area + sizeof length, mine.data(), mine.size());
  // Every rank has attached once it is past the barrier: the name can go, the mappings stay.
  segment.barrier().arriveAndWait(w.localRank, {.what = o.name, .timeout = o.timeout});
  if (w.localRank == 0) segment.unlinkName();
  auto bytesOf = [&](int rank) {
    const auto* a = reinterpret_cast<const unsigned char*>(segment.exchange(rank));
    uint32_t n = 0;
    std::memcpy(&n, a, sizeof n);
    COHORT_CHECK(n <= kMaxAgreementBytes) << "rank " << rank << " wrote " << n << " bytes";
    return std::string(reinterpret_cast<const char*>(a + sizeof n), n);
  };
  Comparison c;
  c.reference = bytesOf(0);
  for (int r = 1; r < w.localWorldSize; ++r) {
    std::string theirs = bytesOf(r);
    if (theirs == c.reference) continue;
    if (c.firstDiffering < 0) {
      c.firstDiffering = r;
      c.differing = std::move(theirs);
      c.referenceHost = c.differingHost = thisHost();  // one node
    }
    ++c.differingRanks;
  }
  return c;
}

// Polls `request` until it completes or `deadline` passes (TimeoutError naming `what`).
void waitFor(MPI_Request& request, Clock::time_point deadline, const AgreementOptions& o, const char* what) {
  ipc::Backoff backoff;
  for (;;) {
    int done = 0;
    mpi_detail::checkMpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
    if (done) return;
    if (Clock::now() >= deadline) {
      // The request can never be completed: MPI_Finalize must not wait for it.
      mpi_detail::MpiEnvironment::acquire().markUnclean();
      COHORT_THROW(TimeoutError) << "agreement '" << o.name << "' (over MPI): not every rank arrived within " << secondsOf(o.timeout) << " s (" << what << ")";
    }
    backoff.pause();
  }
}

// `bytes` (on `root`) on every rank.
std::string broadcast(std::string bytes, int root, Clock::time_point deadline, const AgreementOptions& o) {
  uint32_t length = static_cast<uint32_t>(bytes.size());
  MPI_Request request;
  mpi_detail::checkMpi(MPI_Ibcast(&length, 1, MPI_UINT32_T, root, MPI_COMM_WORLD, &request), "MPI_Ibcast (length)");
  waitFor(request, deadline, o, "MPI_Ibcast");
  bytes.resize(length);
  mpi_detail::checkMpi(MPI_Ibcast(bytes.data(), static_cast<int>(length), MPI_CHAR, root, MPI_COMM_WORLD, &request),
                       "MPI_Ibcast (bytes)");
  waitFor(request, deadline, o, "MPI_Ibcast");
  return bytes;
}

Comparison overMpi(std::string_view mine, const AgreementOptions& o) {
  mpi_detail::MpiEnvironment::acquire();
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (size != o.world.worldSize || rank != o.world.rank) {
    COHORT_THROW(InvalidArgument) << "MPI's world (rank " << rank << " of " << size << ") is not the job's (rank "
                                  << o.world.rank << " of " << o.world.worldSize << " from " << o.world.source
                                  << " variables)";
  }
  const Clock::time_point deadline = Clock::now() + o.timeout;
  const uint64_t digest = runtime::Digest().add(mine).value();
  std::vector<uint64_t> digests(static_cast<size_t>(size));
  MPI_Request request;
  mpi_detail::checkMpi(MPI_Iallgather(&digest, 1, MPI_UINT64_T, digests.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD, &request),
                       "MPI_Iallgather (digests)");
  waitFor(request, deadline, o, "MPI_Iallgather");
  Comparison c;
  for (int r = 1; r < size; ++r) {
    if (digests[static_cast<size_t>(r)] == digests[0]) continue;
    if (c.firstDiffering < 0) c.firstDiffering = r;
    ++c.differingRanks;
  }
  if (c.firstDiffering < 0) {
    // Agreed: rank 0's bytes are everybody's (up to a 64-bit digest collision).
    c.reference = std::string(mine);
    return c;
  }
  // Each of the two sends its host after its bytes ("bytes\0host"), for the message.
  const std::string withHost = std::string(mine) + '\0' + thisHost();
  auto split = [](const std::string& sent, std::string& bytes, std::string& host) {
    const size_t nul = sent.rfind('\0');
    bytes = sent.substr(0, nul);
    host = nul == std::string::npos ? std::string("unknown host") : sent.substr(nul + 1);
  };
  split(broadcast(rank == 0 ? withHost : std::string(), 0, deadline, o), c.reference, c.referenceHost);
  split(broadcast(rank == c.firstDiffering ? withHost : std::string(), c.firstDiffering, deadline, o), c.differing,
        c.differingHost);
  return c;
}

}  // namespace

Comparison compareAcrossRanks(std::string_view mine, const AgreementOptions& o) {
  if (mine.size() > kMaxAgreementBytes) {
    COHORT_THROW(InvalidArgument) << "agreement '" << o.name << "': " << mine.size() << " bytes, at most "
                                  << kMaxAgreementBytes << " may be compared across ranks";
  }
  if (o.world.worldSize == 1) return {.reference = std::string(mine)};
  if (o.roster) o.roster->arriveAndWait("agreement '" + o.name + "'", o.timeout);
  AgreementTransport transport = o.transport;
  if (transport == AgreementTransport::kAuto) {
    transport = o.world.spansNodes() ? AgreementTransport::kMpi : AgreementTransport::kSharedMemory;
  }
  if (transport == AgreementTransport::kSharedMemory) {
    if (o.world.spansNodes()) {
      COHORT_THROW(InvalidArgument) << "agreement '" << o.name << "' over shared memory needs every rank on this node";
    }
    return overSharedMemory(mine, o);
  }
  return overMpi(mine, o);
}

}  // namespace cohort::collectives
