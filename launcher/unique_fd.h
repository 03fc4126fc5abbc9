// UniqueFd: sole owner of one file descriptor, closed when the owner goes out of scope.
//
// Move-only (copy is deleted). get() lends the descriptor without giving up ownership; reset()
// closes it early. Thread safety: none; one owner at a time, like std::unique_ptr.
//
//   UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
//   if (!fd) COHORT_THROW(IoError) << path << ": " << std::strerror(errno);
#pragma once

#include <unistd.h>

#include <utility>

namespace cohort::launcher {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

}  // namespace cohort::launcher
