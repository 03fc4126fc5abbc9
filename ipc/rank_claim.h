// RankClaim: this process's hold on one rank of one job on this node, so that a second job started
// with the same job id is refused at once instead of mixing its ranks with the first (issue 33).
//
// The hold is an abstract unix socket, bound and listening: "\0cohort-rank/<shm dir>/<job id>/<rank>",
// the job id hashed when long, <shm dir> the device and inode of shmDirectory() (jobs collide only
// where they would share segments). Binding a name that a live process holds fails, and the kernel
// releases it when the holder closes it or dies, however it dies. So a claim is never left behind (unlike a file in
// /dev/shm, which a SIGKILL leaves), and a job id is reusable the moment the last holder is gone.
// The refusal names the holder: connecting to its socket yields its pid (SO_PEERCRED).
// Scope: one network namespace and one shared-memory directory; ranks of one job on other nodes
// never meet here (and claim other ranks anyway).
// Ownership: owns the socket (move-only); the descriptor is close-on-exec, so a program the worker
// executes does not hold the rank.
// Thread safety: none needed; one claim per process (train::Job's).
//
//   ipc::RankClaim claim = ipc::RankClaim::take(w.jobId, w.rank, "COHORT_JOB_ID=" + w.jobId);
#pragma once

#include <string>
#include <utility>

#include "runtime/unique_fd.h"

namespace cohort::ipc {

class RankClaim {
 public:
  // InvalidArgument when a live process holds this rank of this job id (naming it, this host and
  // `jobIdSource`, or "id <jobId>" when empty); IoError when no socket can be made.
  static RankClaim take(const std::string& jobId, int rank, const std::string& jobIdSource = "");

  // The abstract socket name (without its leading NUL), for tests and messages.
  static std::string nameFor(const std::string& jobId, int rank);

  RankClaim() = default;

 private:
  explicit RankClaim(runtime::UniqueFd fd) : fd_(std::move(fd)) {}
  runtime::UniqueFd fd_;
};

}  // namespace cohort::ipc
