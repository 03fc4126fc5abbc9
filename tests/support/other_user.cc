#include "tests/support/other_user.h"

#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

namespace cohort::testing {
namespace {

// In a forked child: becomes `user`; returns false (errno set) when any step fails.
bool dropTo(const OtherUser& user) {
  return ::setgroups(0, nullptr) == 0 && ::setgid(user.gid) == 0 && ::setuid(user.uid) == 0 &&
         ::getuid() == user.uid && ::geteuid() == user.uid;
}

// Waits for `pid` for at most `timeoutSeconds`, polling (no signal handlers are touched); SIGKILLs
// it past that. The exit status, or -1 for a signal.
int reap(pid_t pid, int timeoutSeconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSeconds);
  int status = 0;
  for (;;) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) {
      ADD_FAILURE() << "waitpid: " << std::strerror(errno);
      return -1;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "the other user's move ran past " << timeoutSeconds << " s; killed";
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // polling a child's end, not a sync point
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

std::optional<OtherUser> otherUser(std::string* whyNot) {
  OtherUser user;
  if (const passwd* pw = ::getpwnam("nobody")) {
    user.uid = pw->pw_uid;
    user.gid = pw->pw_gid;
    user.name = "nobody";
  } else {
    user.name = "uid " + std::to_string(user.uid);
  }
  if (::geteuid() != 0) {
    if (whyNot) *whyNot = "needs root to run code as a second local user (uid " + std::to_string(::geteuid()) + " here)";
    return std::nullopt;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    if (whyNot) *whyNot = std::string("fork: ") + std::strerror(errno);
    return std::nullopt;
  }
  if (pid == 0) _exit(dropTo(user) ? 0 : (errno & 0x7f));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    if (whyNot) {
      *whyNot = "cannot become " + user.name + " (" +
                std::strerror(WIFEXITED(status) ? WEXITSTATUS(status) : EINVAL) +
                "): a user namespace that maps only root, e.g. Bazel's sandbox (tag the test no-sandbox)";
    }
    return std::nullopt;
  }
  return user;
}

int runAsOtherUser(const OtherUser& user, const std::function<int()>& fn, int timeoutSeconds) {
  const pid_t pid = ::fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    return -1;
  }
  if (pid == 0) {
    if (!dropTo(user)) _exit(127);
    try {
      _exit(fn());
    } catch (...) {
      _exit(126);
    }
  }
  return reap(pid, timeoutSeconds);
}

void giveToOtherUser(const OtherUser& user, const std::string& path) {
  if (::chown(path.c_str(), user.uid, user.gid) != 0) {
    ADD_FAILURE() << "chown " << path << " to " << user.name << ": " << std::strerror(errno);
  }
}

}  // namespace cohort::testing
