// RankClaim: this process's hold on one rank of one job on this node, so that a second job started
// with the same job id is refused at once instead of mixing its ranks with the first (issue 33).
//
// The hold is a unix socket, bound and listening, in this user's private shared-memory directory
// (ipc/private_dir.h): <shmDirectory()>/cohort-<euid>/cohort.<job id>.claim-<rank>, the job id
// hashed when long. Only this user can create a name there, so another user can neither hold our
// ranks nor refuse our jobs (issue 44; an abstract socket, as before, has no owner and no
// permissions, and its name was computable from /proc). Jobs collide only where they would share
// segments (the same directory). The refusal names the holder: connecting to its socket yields its
// pid (SO_PEERCRED).
//
// A socket file outlives a SIGKILLed holder, so taking a claim is serialised with flock() on the
// private directory: under the lock, bind; when the name exists, connect: a live holder is refused,
// a refused connection means its holder is gone, so the file is removed and bound afresh; then
// listen and unlock. The kernel releases the lock when its holder dies, so nothing is ever left
// locked, and a job id is reusable the moment the last holder is gone. Destroying a claim removes
// its file; removeIfStale() (for the sweeps of ipc/shm_names.h) removes those of dead holders.
// Scope: one shared-memory directory; ranks of one job on other nodes never meet here (and claim
// other ranks anyway).
// Ownership: owns the socket and its file (move-only); the descriptors are close-on-exec, so a
// program the worker executes does not hold the rank.
// Thread safety: none needed; one claim per process (train::Job's).
//
//   ipc::RankClaim claim = ipc::RankClaim::take(w.jobId, w.rank, "COHORT_JOB_ID=" + w.jobId);
#pragma once

#include <sys/types.h>

#include <string>

#include "ipc/private_dir.h"
#include "runtime/unique_fd.h"

namespace cohort::ipc {

class RankClaim {
 public:
  // InvalidArgument when a live process holds this rank of this job id (naming it, this host and
  // `jobIdSource`, or "id <jobId>" when empty), or when the private directory or the name is
  // another user's (naming its owner); TimeoutError when the directory stays locked for 10 s;
  // IoError when no socket can be made.
  static RankClaim take(const std::string& jobId, int rank, const std::string& jobIdSource = "");

  // The socket's file name in the private directory ("cohort.<job id>.claim-<rank>").
  static std::string nameFor(const std::string& jobId, int rank);
  // The prefix of the names of the job's claims: jobPrefix(jobId), or the hashed one of a long id.
  static std::string prefixFor(const std::string& jobId);
  // For the sweeps: removes `name` in `dir` and returns true when it is a claim's socket that no
  // live process listens on (decided and removed under the directory's lock). Never throws.
  static bool removeIfStale(const PrivateDirectory& dir, const std::string& name) noexcept;

  RankClaim() = default;
  RankClaim(RankClaim&& other) noexcept;
  RankClaim& operator=(RankClaim&& other) noexcept;
  RankClaim(const RankClaim&) = delete;
  RankClaim& operator=(const RankClaim&) = delete;
  ~RankClaim();

 private:
  void release() noexcept;

  PrivateDirectory dir_;
  std::string name_;
  runtime::UniqueFd socket_;
  dev_t device_ = 0;  // the socket file's identity, so that release() never removes a successor's
  ino_t inode_ = 0;
};

}  // namespace cohort::ipc
