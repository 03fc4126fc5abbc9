#include "runtime/unique_fd.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/error.h"

namespace cohort::runtime {

void readFullyAt(int fd, void* into, size_t bytes, uint64_t offset, const std::string& path) {
  constexpr size_t kMaxSyscallBytes = size_t{1} << 30;
  auto* p = static_cast<char*>(into);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, std::min(bytes, kMaxSyscallBytes), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) COHORT_THROW(IoError) << path << ": read failed at byte " << offset << ": " << std::strerror(errno);
    if (n == 0) COHORT_THROW(IoError) << path << ": unexpected end of file at byte " << offset << " (file shrank?)";
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

}  // namespace cohort::runtime
