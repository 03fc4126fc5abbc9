#include "runtime/output_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>

#include "runtime/error.h"

namespace cohort::runtime {

namespace {

constexpr size_t kMaxWriteBytes = size_t{1} << 30;  // one write(2) at most (Linux moves <2 GiB)

}  // namespace

// 48 bits: a name nobody predicts.
std::string unpredictableSuffix() {
  unsigned char bytes[6] = {};
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) COHORT_THROW(IoError) << "cannot draw a random file name: " << std::strerror(errno);
    got += static_cast<size_t>(n);
  }
  char text[16];
  std::snprintf(text, sizeof text, "%02x%02x%02x%02x%02x%02x", bytes[0], bytes[1], bytes[2], bytes[3], bytes[4],
                bytes[5]);
  return text;
}

namespace {

// The pid in a temporary's name after "<prefix>": "<pid>" (older Cohorts) or "<pid>.<hex>"; -1 for
// any other name.
pid_t writerPidOf(const std::string& rest) {
  const size_t dot = rest.find('.');
  const std::string digits = rest.substr(0, dot);
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  if (dot != std::string::npos) {
    const std::string suffix = rest.substr(dot + 1);
    if (suffix.empty() || suffix.find_first_not_of("0123456789abcdef") != std::string::npos) return -1;
  }
  return static_cast<pid_t>(std::stol(digits));
}

// Removes `name` in the directory `dirFd` when it is an orphaned temporary of ours (see the header).
bool removeIfOrphan(int dirFd, const std::string& name, pid_t writer) {
  if (writer == ::getpid() || ::kill(writer, 0) == 0 || errno == EPERM) return false;  // its writer lives
  struct stat named {};
  if (::fstatat(dirFd, name.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0) return false;
  if (!S_ISREG(named.st_mode) || named.st_uid != ::geteuid()) return false;  // never another's, never a link
  UniqueFd fd(::openat(dirFd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  struct stat opened {};
  if (!fd || ::fstat(fd.get(), &opened) != 0 || opened.st_ino != named.st_ino || opened.st_dev != named.st_dev) {
    return false;
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) return false;  // held: a writer is at work
  return ::unlinkat(dirFd, name.c_str(), 0) == 0;
}

[[noreturn]] void throwErrno(const std::string& path, const std::string& what) {
  const int err = errno;
  COHORT_THROW(IoError) << path << ": " << what << ": " << std::strerror(err);
}

// The process's umask, read without changing it (/proc/self/status; 022 where that is unknown).
mode_t currentUmask() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Umask:", 0) == 0) return static_cast<mode_t>(std::strtoul(line.c_str() + 6, nullptr, 8) & 0777);
  }
  return 022;
}

}  // namespace

namespace {

// One component of createDirectories: 1 when it made it, 0 when it was there. `dir`: the name
// messages give.
int createDirectory(const std::string& dir, const std::string& component) {
  struct stat st;
  if (::stat(component.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) COHORT_THROW(IoError) << dir << ": cannot create directory " << component << ": a file is there";
    return 0;
  }
  if (errno != ENOENT) throwErrno(dir, "cannot create directory " + component);
  if (::mkdir(component.c_str(), 0777) == 0) return 1;
  if (errno != EEXIST) throwErrno(dir, "cannot create directory " + component);
  // Made between the look and the mkdir: another rank of this job, or another user.
  if (::lstat(component.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) {
    COHORT_THROW(IoError) << dir << ": cannot create directory " << component
                          << ": something else was created there meanwhile, not a directory of this user";
  }
  return 0;
}

}  // namespace

namespace {

// createDirectories, its messages naming `named` (the output path whose directory it makes).
int createDirectoriesFor(const std::string& dir, const std::string& named) {
  int created = 0;
  for (size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    const std::string component = dir.substr(0, end);
    if (!component.empty() && component.back() != '/') created += createDirectory(named, component);
    if (end == std::string::npos) return created;
  }
}

}  // namespace

int createDirectories(const std::string& dir) { return createDirectoriesFor(dir, dir); }

int createParentDirectories(const std::string& path) { return createDirectoriesFor(splitOutputPath(path).first, path); }

std::pair<std::string, std::string> splitOutputPath(const std::string& path) {
  const size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty()) {
    COHORT_THROW(InvalidArgument) << path << ": the path names a directory (it ends in '/'): give a file name";
  }
  return {dir, base};
}

size_t removeStaleTemporaries(const std::string& path) {
  const auto [dir, base] = splitOutputPath(path);
  const std::string prefix = "." + base + ".tmp.";
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
  if (!d) return 0;
  size_t removed = 0;
  while (const dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const pid_t writer = writerPidOf(name.substr(prefix.size()));
    if (writer > 0 && removeIfOrphan(::dirfd(d.get()), name, writer)) ++removed;
  }
  return removed;
}

OutputFile::OutputFile(std::string path, OutputFileOptions options) : path_(std::move(path)), options_(options) {
  const auto [dir, base] = splitOutputPath(path_);
  directory_ = dir;
  removeStaleTemporaries(path_);
  const std::string stem = dir + "/." + base + ".tmp." + std::to_string(::getpid()) + ".";
  for (int attempt = 0; !fd_; ++attempt) {
    temporary_ = stem + unpredictableSuffix();
    fd_ = UniqueFd(::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    // EEXIST: a name drawn twice, or one planted in advance; draw again (100 misses: someone floods).
    if (!fd_ && (errno != EEXIST || attempt == 100)) throwErrno(path_, "cannot create temporary file " + temporary_);
  }
  // Held until the rename (on a duplicate, which outlives fd_'s checked close), so that another
  // writer's removeStaleTemporaries never takes this file for an orphan; it goes with the process.
  lock_ = UniqueFd(::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0));
  if (!lock_ || ::flock(lock_.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::unlink(temporary_.c_str());
    errno = err;
    throwErrno(path_, "cannot lock temporary file " + temporary_);
  }
}

OutputFile::~OutputFile() {
  if (!committed_) ::unlink(temporary_.c_str());
}

void OutputFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_.get(), p, std::min(bytes, kMaxWriteBytes));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      throwErrno(path_, "cannot write temporary file " + temporary_);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void OutputFile::commit() {
  const mode_t mode = options_.mode == OutputMode::kPrivate ? 0600 : (0666 & ~currentUmask());
  if (::fchmod(fd_.get(), mode) != 0) throwErrno(path_, "cannot set the mode of temporary file " + temporary_);
  if (::fsync(fd_.get()) != 0) throwErrno(path_, "cannot fsync temporary file " + temporary_);
  if (fd_.close() != 0) throwErrno(path_, "cannot close temporary file " + temporary_);
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) {
    throwErrno(path_, "cannot rename temporary file " + temporary_ + " over it");
  }
  committed_ = true;
  lock_.reset();
  // Makes the rename durable: the directory entry lives in the directory's own data.
  UniqueFd dir(::open(directory_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir || ::fsync(dir.get()) != 0) throwErrno(path_, "written, but cannot fsync directory " + directory_);
}

}  // namespace cohort::runtime
