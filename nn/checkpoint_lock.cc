// CheckpointLock (nn/checkpoint.h): one run per checkpoint path, judged by who holds the flock now.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/checkpoint_format.h"
#include "runtime/output_file.h"
#include "runtime/unique_fd.h"
#include "runtime/user_name.h"

namespace cohort::nn {

using namespace detail;

namespace {

[[noreturn]] void refuseForeignOwner(const std::string& lockPath, uid_t owner) {
  COHORT_THROW(IoError) << lockPath << " is owned by " << runtime::describeUser(owner)
                        << ", not you: it is no lock of your runs; remove it (or have its owner remove it), or give "
                           "this run another --checkpoint";
}

// The lock file of `path`, opened (created 0600 when absent) only when it is a regular file of this
// user: never through a symbolic link, never another user's file (which that user could lock, empty
// or fill at will).
runtime::UniqueFd openLockFile(const std::string& path, const std::string& lockPath) {
  runtime::UniqueFd fd(::open(lockPath.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600));
  if (!fd) {
    const int err = errno;
    struct stat st {};
    if (::lstat(lockPath.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      Refusal(path) << "the lock file " << lockPath << " is a symbolic link: remove it, or give this run another "
                    << "--checkpoint";
    }
    if (::lstat(lockPath.c_str(), &st) == 0 && st.st_uid != ::geteuid()) refuseForeignOwner(lockPath, st.st_uid);
    errno = err;
    refuseWithErrno(path, "cannot create the lock file " + lockPath);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) refuseWithErrno(path, "cannot stat the lock file " + lockPath);
  if (!S_ISREG(st.st_mode)) {
    Refusal(path) << "the lock file " << lockPath << " is not a regular file: remove it, or give this run another "
                  << "--checkpoint";
  }
  if (st.st_uid != ::geteuid()) refuseForeignOwner(lockPath, st.st_uid);
  return fd;
}

// Whether `fd` is still the file named `path` (a holder may have removed or replaced it meanwhile).
bool sameFile(int fd, const std::string& path) {
  struct stat opened {
  }, named{};
  return ::fstat(fd, &opened) == 0 && ::lstat(path.c_str(), &named) == 0 && opened.st_ino == named.st_ino &&
         opened.st_dev == named.st_dev;
}

// The processes that hold a flock on `fd`'s file now, as /proc/locks lists them ("1: FLOCK
// ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF"; waiters, "1: -> FLOCK ...", are skipped).
// A holder in another pid namespace is listed as pid 0; a lock on NFS held on another host not at
// all.
std::vector<pid_t> flockHolders(int fd) {
  struct stat st {};
  std::vector<pid_t> holders;
  if (::fstat(fd, &st) != 0) return holders;
  char file[64];
  std::snprintf(file, sizeof file, "%02x:%02x:%llu", ::major(st.st_dev), ::minor(st.st_dev),
                static_cast<unsigned long long>(st.st_ino));
  std::ifstream locks("/proc/locks");
  std::string line;
  while (std::getline(locks, line)) {
    std::istringstream fields(line);
    std::string id, kind, advisory, mode, where;
    long pid = -1;
    if (!(fields >> id >> kind) || kind != "FLOCK") continue;
    if (fields >> advisory >> mode >> pid >> where && where == file) holders.push_back(static_cast<pid_t>(pid));
  }
  return holders;
}

// Whether a process of this user may hold the lock: true unless every holder is known and is another
// user's process. Unknown holders (none listed, pid 0) count as ours: better refused than two runs.
bool lockHeldByUs(int fd) {
  const std::vector<pid_t> holders = flockHolders(fd);
  if (holders.empty()) return true;
  for (pid_t pid : holders) {
    struct stat st {};
    if (pid <= 0) return true;
    if (::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0 || st.st_uid == ::geteuid()) return true;
  }
  return false;
}

// Who holds the lock, for messages: the live holder's pid where /proc/locks names it, else what the
// lock file says (its writer's pid and host: a hint only, e.g. for a holder on another NFS client).
std::string lockHolder(int fd) {
  for (pid_t pid : flockHolders(fd)) {
    if (pid <= 0) continue;
    char host[256] = "unknown host";
    ::gethostname(host, sizeof host - 1);
    return "pid " + std::to_string(pid) + " on " + host;
  }
  char recorded[256] = {};
  const ssize_t n = ::pread(fd, recorded, sizeof recorded - 1, 0);
  std::string who(recorded, static_cast<size_t>(std::max<ssize_t>(n, 0)));
  while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
  // Printable only: the file is ours, but its text came from whoever wrote it last.
  for (char& c : who) c = (c >= 0x20 && c < 0x7f) ? c : '?';
  return who.empty() ? "a process this machine does not list (its lock file names none)"
                     : "a process this machine does not list; its lock file says " + who;
}

}  // namespace

CheckpointLock::CheckpointLock(const std::string& path) {
  const auto [dir, base] = runtime::splitOutputPath(path);
  lockPath_ = dir + "/." + base + ".lock";
  // The file must still be the one locked (another holder may have removed it meanwhile): else again.
  for (int attempt = 0; attempt < 100; ++attempt) {
    runtime::UniqueFd fd = openLockFile(path, lockPath_);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (!lockHeldByUs(fd.get())) {
        // Held, but by no process of this user: no run of ours. The file is ours, so it is ours to
        // replace; the other user keeps a lock on a file nobody looks at any more.
        if (sameFile(fd.get(), lockPath_)) ::unlink(lockPath_.c_str());
        continue;
      }
      Refusal(path) << "another run is writing its checkpoints here (" << lockHolder(fd.get()) << "; " << lockPath_
                    << "): stop it first, or give this run another --checkpoint";
    }
    if (!sameFile(fd.get(), lockPath_)) continue;
    (void)::fchmod(fd.get(), 0600);  // an older version's 0644 file: nobody else opens it from now on
    char host[256] = "unknown host";
    ::gethostname(host, sizeof host - 1);
    const std::string me = "pid " + std::to_string(::getpid()) + " on " + host + "\n";
    // Says who holds it, for the message of a second run; a lock file that cannot take these few
    // bytes is a directory that will not take a checkpoint either.
    if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
      refuseWithErrno(path, "cannot record this run in the lock file " + lockPath_);
    }
    fd_ = fd.release();
    return;
  }
  Refusal(path) << "cannot take the lock file " << lockPath_ << ": it keeps being replaced";
}

std::optional<std::string> checkpointLockHolder(const std::string& path) {
  const auto [dir, base] = runtime::splitOutputPath(path);
  const std::string lockPath = dir + "/." + base + ".lock";
  runtime::UniqueFd fd(::open(lockPath.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  // Held at all? Taken and let go at once if nobody holds it (a run starting in that instant is
  // refused as if two had started together; /proc/locks alone cannot tell "free" from "unlisted").
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) {
    ::flock(fd.get(), LOCK_UN);
    return std::nullopt;
  }
  if (!lockHeldByUs(fd.get())) return std::nullopt;
  return lockHolder(fd.get()) + "; " + lockPath;
}

CheckpointLock::CheckpointLock(CheckpointLock&& other) noexcept
    : lockPath_(std::move(other.lockPath_)), fd_(std::exchange(other.fd_, -1)) {}

CheckpointLock::~CheckpointLock() {
  if (fd_ < 0) return;
  ::unlink(lockPath_.c_str());  // while still held: a run that opened it before finds it gone and tries again
  ::close(fd_);
}

}  // namespace cohort::nn
