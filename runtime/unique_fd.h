// UniqueFd: sole owner of one file descriptor, closed when the owner goes out of scope.
//
// Ownership: move-only (copy is deleted); a moved-from owner is empty. get() lends the descriptor
// without giving up ownership; release() gives it up without closing it. reset() closes it early
// and ignores the result, as the destructor must. close() closes it early and returns what ::close
// returned (0, or -1 with errno set), for writers whose data may be lost at close (NFS, a full
// disk): check it where a failed close is an error. The owner is empty after either, even when
// ::close fails: Linux has released the descriptor by then, and closing it again could close one
// that another thread has just opened. Thread safety: none; one owner at a time, like
// std::unique_ptr. Never links CUDA (it is part of //runtime:base), so the launcher may use it.
//
//   UniqueFd fd(::open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
//   if (!fd) COHORT_THROW(IoError) << path << ": " << std::strerror(errno);
//   if (fd.close() != 0) COHORT_THROW(IoError) << path << ": close: " << std::strerror(errno);
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace cohort::runtime {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}  // takes ownership; a negative fd makes an empty owner
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }

  // Closes the descriptor, if any, ignoring errors.
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // Closes the descriptor and returns ::close's result: 0, or -1 with errno set (EBADF when empty).
  int close() { return ::close(release()); }

  // Gives up ownership: returns the descriptor (-1 when empty), which the caller must now close.
  [[nodiscard]] int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// Reads exactly `bytes` from `fd` at file offset `offset` (pread: short reads and EINTR retried, the
// file position untouched). IoError "<path>: read failed at byte N: <errno text>", or "<path>:
// unexpected end of file at byte N (file shrank?)" where the file ends first.
void readFullyAt(int fd, void* into, size_t bytes, uint64_t offset, const std::string& path);

}  // namespace cohort::runtime
