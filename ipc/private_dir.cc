#include "ipc/private_dir.h"

#include <fcntl.h>
#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

#include "ipc/shm_names.h"
#include "runtime/error.h"
#include "runtime/user_name.h"

namespace cohort::ipc {
namespace {

// What a non-directory, non-regular thing found where ours should be is, for messages.
const char* kindOf(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISREG(mode)) return "a regular file";
  return "a special file";
}

std::string thisUser() { return runtime::describeUser(::geteuid()); }

// The directory at `path` (lstat or fstat in `st`) is not this user's private directory.
[[noreturn]] void refuseDirectory(const std::string& path, const struct stat& st) {
  std::ostringstream os;
  os << "the private shared-memory directory " << path << " ";
  if (!S_ISDIR(st.st_mode)) {
    os << "is " << kindOf(st.st_mode) << " owned by " << runtime::describeUser(st.st_uid) << ", not a directory";
  } else {
    os << "belongs to " << runtime::describeUser(st.st_uid) << ", not to this user, " << thisUser();
  }
  os << ": another user created it, which would let them see or block this user's jobs. Ask an administrator to "
        "remove it, or set COHORT_SHM_DIR to a directory of your own";
  throw InvalidArgument(os.str());
}

}  // namespace

std::string privateDirectoryPath() { return shmDirectory() + "/cohort-" + std::to_string(::geteuid()); }

PrivateDirectory openPrivateDirectory() {
  PrivateDirectory dir;
  dir.path = privateDirectoryPath();
  if (::mkdir(dir.path.c_str(), 0700) != 0 && errno != EEXIST) {
    COHORT_THROW(IoError) << "cannot create the private shared-memory directory " << dir.path << ": "
                          << std::strerror(errno) << " (is " << shmDirectory() << " a writable directory?)";
  }
  // O_NOFOLLOW: a symlink planted in the name is never followed (open fails with ELOOP or ENOTDIR).
  dir.fd = runtime::UniqueFd(::open(dir.path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!dir.fd) {
    const int err = errno;
    if (::lstat(dir.path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) refuseDirectory(dir.path, st);
    COHORT_THROW(IoError) << "cannot open the private shared-memory directory " << dir.path << ": "
                          << std::strerror(err);
  }
  if (::fstat(dir.fd.get(), &st) != 0) {
    COHORT_THROW(IoError) << "cannot inspect the private shared-memory directory " << dir.path << ": "
                          << std::strerror(errno);
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) refuseDirectory(dir.path, st);
  // Ours: a umask that narrowed the mkdir, or a chmod that widened it, is set right.
  if ((st.st_mode & 07777) != 0700 && ::fchmod(dir.fd.get(), 0700) != 0) {
    COHORT_THROW(IoError) << "cannot set mode 0700 on the private shared-memory directory " << dir.path << ": "
                          << std::strerror(errno);
  }
  return dir;
}

void requireOwnRegularFile(const struct stat& st, const std::string& path, const std::string& what) {
  if (S_ISREG(st.st_mode) && st.st_uid == ::geteuid()) return;
  std::ostringstream os;
  os << what << " " << path << " ";
  if (!S_ISREG(st.st_mode)) {
    os << "is " << kindOf(st.st_mode) << " owned by " << runtime::describeUser(st.st_uid) << ", not a regular file";
  } else {
    os << "belongs to " << runtime::describeUser(st.st_uid) << ", not to this user, " << thisUser();
  }
  os << ": this user's jobs did not make it and will not use it; its owner or an administrator must remove it";
  throw InvalidArgument(os.str());
}

}  // namespace cohort::ipc
