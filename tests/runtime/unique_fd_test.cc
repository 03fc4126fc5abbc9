// UniqueFd: owns one descriptor, closes it once (destructor, reset, close), hands it over on move
// and on release, and reports close() errors as ::close does.
#include "runtime/unique_fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace cohort::runtime {
namespace {

bool isOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST(UniqueFd, ClosesWhenItGoesAndNotBefore) {
  int raw = -1;
  {
    UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(fd);
    raw = fd.get();
    EXPECT_TRUE(isOpen(raw));
  }
  EXPECT_FALSE(isOpen(raw));
  EXPECT_FALSE(UniqueFd());
}

TEST(UniqueFd, MoveHandsOverAndReleaseGivesUp) {
  UniqueFd a(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  const int raw = a.get();
  UniqueFd b(std::move(a));
  EXPECT_FALSE(a);
  EXPECT_EQ(b.get(), raw);
  UniqueFd c;
  c = std::move(b);
  EXPECT_EQ(c.get(), raw);
  const int released = c.release();
  EXPECT_FALSE(c);
  EXPECT_TRUE(isOpen(released));  // the caller owns it now
  EXPECT_EQ(::close(released), 0);
}

TEST(UniqueFd, CloseReportsLikeCloseAndLeavesNothingToCloseAgain) {
  UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  const int raw = fd.get();
  EXPECT_EQ(fd.close(), 0);
  EXPECT_FALSE(fd);
  EXPECT_FALSE(isOpen(raw));
  errno = 0;
  EXPECT_EQ(fd.close(), -1);  // empty: EBADF, as ::close(-1)
  EXPECT_EQ(errno, EBADF);
  fd.reset();  // harmless when empty
}

}  // namespace
}  // namespace cohort::runtime
