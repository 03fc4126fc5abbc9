#include "collectives/mpi/mpi_environment.h"

#include <openmpi/mpi.h>

#include <atomic>
#include <mutex>

#include "runtime/error.h"

namespace cohort::collectives::mpi_detail {

namespace {
std::mutex& environmentMutex() {
  static std::mutex mutex;
  return mutex;
}
std::atomic<bool> processFailing{false};
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
  if (!finalized) MPI_Finalize();
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
