// MpiEnvironment: MPI's process-wide initialisation, owned once per process.
//
// MPI can be initialised and finalised once per process, so this is the one process-wide object of
// the backend (a function-local static; it holds no state a caller could misuse). acquire()
// initialises MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE) unless the program already did;
// the static's destructor, at process exit, calls MPI_Finalize only if Cohort initialised MPI and
// no communicator left requests unfinished (markUnclean): MPI_Finalize with a request pending, or
// with a peer stuck, can hang, and a job that failed with a timeout is better ended by mpirun
// noticing the missing MPI_Finalize than by a hang.
// Thread safety: every member function may be called from any thread.
#pragma once

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

  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

 private:
  MpiEnvironment();
  ~MpiEnvironment();

  bool initialisedHere_ = false;
  bool unclean_ = false;
  bool failed_ = false;
};

// collectives::markProcessFailing(): MPI_Finalize is skipped at exit (without starting MPI).
void markProcessFailing();

// Throws PeerError "<what>: <MPI's error string>" when rc is not MPI_SUCCESS.
void checkMpi(int rc, const char* what);

}  // namespace cohort::collectives::mpi_detail
