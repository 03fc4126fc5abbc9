#include "runtime/data/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/error.h"

namespace cohort::runtime::data {

const char* fileTypeName(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO or pipe";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

void requireRegularFile(const std::string& path, mode_t mode) {
  if (!S_ISREG(mode)) COHORT_THROW(IoError) << path << ": is " << fileTypeName(mode) << ", not a regular file";
}

void requireDirectoryIfPresent(const std::string& path, const char* hint) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    COHORT_THROW(IoError) << path << ": is " << fileTypeName(st.st_mode) << ", not a directory; " << hint;
  }
}

runtime::UniqueFd openRegularFile(const std::string& path) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer before fstat could refuse it.
  runtime::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) {
    if (errno == ENOENT) COHORT_THROW(IoError) << path << ": no such file";
    COHORT_THROW(IoError) << path << ": cannot open: " << std::strerror(errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) COHORT_THROW(IoError) << path << ": cannot stat: " << std::strerror(errno);
  requireRegularFile(path, st.st_mode);
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    COHORT_THROW(IoError) << path << ": cannot set blocking reads: " << std::strerror(errno);
  }
  return fd;
}

std::string readRegularFile(const std::string& path) {
  runtime::UniqueFd fd = openRegularFile(path);
  struct stat st {};
  std::string bytes;
  // Read to the end rather than st_size bytes: files under /proc report size 0 and still hold text.
  if (::fstat(fd.get(), &st) == 0 && st.st_size > 0) bytes.reserve(static_cast<size_t>(st.st_size));
  char chunk[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.get(), chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      COHORT_THROW(IoError) << path << ": read failed at byte " << bytes.size() << ": " << std::strerror(errno);
    }
    if (n == 0) return bytes;
    bytes.append(chunk, static_cast<size_t>(n));
  }
}

}  // namespace cohort::runtime::data
