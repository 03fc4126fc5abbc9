#include "collectives/mpi/mpi_environment.h"

#include <openmpi/mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "runtime/error.h"

namespace cohort::collectives::mpi_detail {

namespace {
std::mutex& environmentMutex() {
  static std::mutex mutex;
  return mutex;
}
std::atomic<bool> processFailing{false};

using Clock = std::chrono::steady_clock;

// The end of the job. MPI_Finalize is a fence over every process of the job (a PMIx fence in Open
// MPI): a rank that enters it while a peer is failing waits there for that peer, and mpirun, which
// then ends the job on the peer's non-zero exit, was seen to hang for good with the finished rank in
// the fence (and its failed peers unreaped). So ranks meet before it, outside any fence and with a
// deadline: every rank sends rank 0 a zero-byte "finished" message (tag kEndTag on MPI_COMM_WORLD:
// point to point, apart from every collective), and rank 0, once every rank's has come, answers
// each. A rank calls MPI_Finalize only when every rank finished (rank 0: all messages came; the
// others: rank 0's answer came); then every process reaches the fence. Otherwise it says which
// ranks did not finish and leaves without MPI_Finalize, as a failing rank does.
constexpr int kEndTag = 0x436f68;  // "Coh"

// Polls `requests` until all complete (true) or `deadline` passes (false); `done[i]` says which did.
bool waitAll(std::vector<MPI_Request>& requests, std::vector<int>& done, Clock::time_point deadline) {
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (!done[i] && MPI_Test(&requests[i], &done[i], MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
      all = all && done[i];
    }
    if (all) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

std::string describeRank(const std::vector<Member>& world, int rank) {
  const auto r = static_cast<size_t>(rank);
  return std::to_string(rank) + (r < world.size() ? " (" + world[r].host + ")" : "");
}

// True when every rank finished; otherwise prints who did not, on stderr, and returns false.
bool meetAtTheEnd(std::chrono::milliseconds timeout, const std::vector<Member>& world) {
  int rank = 0, size = 1;
  if (MPI_Comm_rank(MPI_COMM_WORLD, &rank) != MPI_SUCCESS || MPI_Comm_size(MPI_COMM_WORLD, &size) != MPI_SUCCESS)
    return false;
  if (size == 1) return true;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  const Clock::time_point deadline = Clock::now() + timeout;
  const double seconds = static_cast<double>(timeout.count()) / 1000;
  std::ostringstream why;
  if (rank == 0) {
    std::vector<MPI_Request> finished(static_cast<size_t>(size - 1), MPI_REQUEST_NULL);
    std::vector<int> came(finished.size(), 0);
    for (int r = 1; r < size; ++r) MPI_Irecv(nullptr, 0, MPI_BYTE, r, kEndTag, MPI_COMM_WORLD, &finished[static_cast<size_t>(r - 1)]);
    if (waitAll(finished, came, deadline)) {
      std::vector<MPI_Request> answers(finished.size(), MPI_REQUEST_NULL);
      std::vector<int> sent(answers.size(), 0);
      for (int r = 1; r < size; ++r) MPI_Isend(nullptr, 0, MPI_BYTE, r, kEndTag, MPI_COMM_WORLD, &answers[static_cast<size_t>(r - 1)]);
      return waitAll(answers, sent, deadline + timeout);
    }
    std::vector<int> missing;
    for (size_t i = 0; i < came.size(); ++i) if (!came[i]) missing.push_back(static_cast<int>(i) + 1);
    why << (missing.size() == 1 ? "rank " : "ranks ");
    for (size_t i = 0; i < missing.size(); ++i) why << (i ? ", " : "") << describeRank(world, missing[i]);
    why << (missing.size() == 1 ? " has" : " have") << " not finished within " << seconds << " s of this rank";
  } else {
    std::vector<MPI_Request> requests(2, MPI_REQUEST_NULL);
    std::vector<int> done(2, 0);
    MPI_Isend(nullptr, 0, MPI_BYTE, 0, kEndTag, MPI_COMM_WORLD, &requests[0]);
    MPI_Irecv(nullptr, 0, MPI_BYTE, 0, kEndTag, MPI_COMM_WORLD, &requests[1]);
    if (waitAll(requests, done, deadline)) return true;
    why << "rank " << describeRank(world, 0) << " did not confirm within " << seconds
        << " s that every rank finished (a rank failed or is still working, or rank 0 is gone)";
  }
  std::fprintf(stderr, "[rank %d] cohort: error: the end of the job: %s; leaving without MPI_Finalize, whose fence would wait for them\n",
               rank, why.str().c_str());
  std::fflush(stderr);
  return false;
}
}  // namespace

void markProcessFailing() { processFailing.store(true); }

MpiEnvironment::MpiEnvironment() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized)
    COHORT_THROW(InvalidArgument) << "the mpi backend cannot start: MPI was already finalised in this process";
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;  // the program owns MPI; it finalises it too
  int provided = 0;
  // MPI_THREAD_MULTIPLE: MpiStore's service thread calls MPI beside the communicator's thread. (The
  // communicator alone would do with MPI_THREAD_SERIALIZED: callers issue and wait from one thread.)
  checkMpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  initialisedHere_ = true;
}

MpiEnvironment::~MpiEnvironment() {
  std::lock_guard<std::mutex> lock(environmentMutex());
  if (!initialisedHere_ || unclean_ || processFailing.load()) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // 1.5 x the longest wait of this rank's communicators (the default --timeout where none said its
  // own): a peer still waiting in a collective when this rank finished fails first, so that its exit
  // code and message are the job's, and mpirun ends this rank before it gives up.
  const std::chrono::milliseconds timeout = endTimeout_.count() > 0 ? endTimeout_ : std::chrono::milliseconds(300000);
  if (meetAtTheEnd(timeout * 3 / 2, world_)) MPI_Finalize();
}

void MpiEnvironment::noteCommunicator(std::chrono::milliseconds timeout, const std::vector<Member>& members,
                                      int worldSize) {
  std::lock_guard<std::mutex> lock(environmentMutex());
  endTimeout_ = std::max(endTimeout_, timeout);
  if (!world_.empty() || static_cast<int>(members.size()) != worldSize) return;
  world_.resize(members.size());
  for (const Member& m : members) {
    if (m.worldRank >= 0 && m.worldRank < worldSize) world_[static_cast<size_t>(m.worldRank)] = m;
  }
}

MpiEnvironment& MpiEnvironment::acquire() {
  std::lock_guard<std::mutex> lock(environmentMutex());
  static MpiEnvironment environment;  // constructed once; a throwing constructor is retried next time
  return environment;
}

void MpiEnvironment::markUnclean() {
  std::lock_guard<std::mutex> lock(environmentMutex());
  unclean_ = true;
}

void MpiEnvironment::markFailed() {
  std::lock_guard<std::mutex> lock(environmentMutex());
  failed_ = true;
}

bool MpiEnvironment::failed() const {
  std::lock_guard<std::mutex> lock(environmentMutex());
  return failed_;
}

void checkMpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  COHORT_THROW(PeerError) << what << " failed: " << std::string(text, length);
}

}  // namespace cohort::collectives::mpi_detail
