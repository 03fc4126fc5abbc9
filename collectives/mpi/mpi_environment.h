// MpiEnvironment: MPI's process-wide initialisation, owned once per process.
//
// MPI can be initialised and finalised once per process, so this is the one process-wide object of
// the backend (a function-local static; it holds no state a caller could misuse). acquire()
// initialises MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE) unless the program already did;
// the static's destructor, at process exit, calls MPI_Finalize only if Cohort initialised MPI and
// no communicator left requests unfinished (markUnclean): MPI_Finalize with a request pending, or
// with a peer stuck, can hang, and a job that failed with a timeout is better ended by mpirun
// noticing the missing MPI_Finalize than by a hang. Before MPI_Finalize every rank meets the others
// at the end of the job, with a deadline (meetAtTheEnd in the .cc): a rank that finished while a
// peer failed leaves without MPI_Finalize, naming the peers that did not finish.
// Thread safety: every member function may be called from any thread.
#pragma once

#include <chrono>
#include <vector>

#include "collectives/mpi/mpi_members.h"

namespace cohort::collectives::mpi_detail {

class MpiEnvironment {
 public:
  // Initialises MPI if needed. Throws InvalidArgument when MPI was already finalised.
  static MpiEnvironment& acquire();
  // Some request will never be completed: do not call MPI_Finalize at exit.
  void markUnclean();
  // A communicator of this process failed (a timeout, a mismatch, an MPI error), and whether one did:
  // the others then abandon what is pending when destroyed rather than wait for it.
  void markFailed();
  bool failed() const;
  // A communicator's wait bound, and (from a communicator over the whole world, indexed by world
  // rank) who the ranks are: the end of the job waits for the others as long as the longest bound,
  // and names those that did not come.
  void noteCommunicator(std::chrono::milliseconds timeout, const std::vector<Member>& members, int worldSize);

  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

 private:
  MpiEnvironment();
  ~MpiEnvironment();

  bool initialisedHere_ = false;
  bool unclean_ = false;
  bool failed_ = false;
  std::chrono::milliseconds endTimeout_{0};  // 0: no communicator was made (the default --timeout then)
  std::vector<Member> world_;                 // by world rank; empty until a communicator spans the world
};

// collectives::markProcessFailing(): MPI_Finalize is skipped at exit (without starting MPI).
void markProcessFailing();

// Throws PeerError "<what>: <MPI's error string>" when rc is not MPI_SUCCESS.
void checkMpi(int rc, const char* what);

}  // namespace cohort::collectives::mpi_detail
