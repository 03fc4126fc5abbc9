// The calling user's private directory in the shared-memory directory, where every per-job name of
// a job lives: its segments (cohort.<job>.<name>), its roster and its rank claims (issue 44).
//
//   <shmDirectory()>/cohort-<euid>/     mode 0700, owned by the effective uid
//
// Why: /dev/shm is writable by everyone, and a job's names are guessable (cohortrun's job id is made
// from world-readable /proc fields, COHORT_JOB_ID and SLURM's job-step are fixed). Another user who
// created one of them first could refuse, delay or join a job. Inside a directory that only its
// owner can write, nobody else can create, replace or remove a name; the worst another user can do
// is create the directory itself before us, and that is refused at once with a message that says
// whose it is and what to do (the tmux answer: a clear refusal, never a wait, never adoption).
//
// openPrivateDirectory() makes the directory when it is missing (mkdir 0700), then opens it with
// O_DIRECTORY|O_NOFOLLOW and checks with fstat that it is a directory owned by us; bits other than
// 0700 (a umask that narrowed it, a chmod) are set back with fchmod, as the directory is ours. A
// symlink, a non-directory or a directory of another owner is an InvalidArgument (exit code 2)
// naming the path and its owner. The directory is never removed: jobs of the same user come and go
// in it concurrently, and an empty directory costs nothing (like /tmp/tmux-<uid>).
// Thread safety: every function is safe to call concurrently (only the file system is used).
//
//   ipc::PrivateDirectory dir = ipc::openPrivateDirectory();
//   int fd = ::openat(dir.fd.get(), "cohort.job.x", O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string>

#include "runtime/unique_fd.h"

namespace cohort::ipc {

struct PrivateDirectory {
  std::string path;      // <shmDirectory()>/cohort-<euid>
  runtime::UniqueFd fd;  // the verified directory (O_DIRECTORY, close-on-exec)
};

// "<shmDirectory()>/cohort-<euid>"; creates nothing (for messages and for tests).
std::string privateDirectoryPath();

// Makes (when missing) and verifies the directory; InvalidArgument when it is not ours (see above),
// IoError when the file system refuses.
PrivateDirectory openPrivateDirectory();

// Throws InvalidArgument naming `path`, what it is and its owner unless `st` (from fstat of an open
// descriptor, or lstat) is a regular file owned by the effective uid. `what` names the file's role
// in the message ("shared-memory segment", "job roster").
void requireOwnRegularFile(const struct stat& st, const std::string& path, const std::string& what);

}  // namespace cohort::ipc
