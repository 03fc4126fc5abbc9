// Helpers for tests that run ranks as forked processes, each with a fresh shared-memory directory
// and job id (STYLE.md §10).
//
// A child runs a function and leaves with _exit(): 0 on success, the function's non-zero result on a
// failed expectation, the cohort exit code of a cohort::Error it threw (3 timeout, 4 peer, ...), or
// 99 for anything else, so the parent sees every failure through waitChild(). Every wait has a
// timeout; a child that outlives it is killed and reported.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/error.h"

namespace cohort::ipc::testing {

// A fresh directory, used as $COHORT_SHM_DIR while the object lives; emptied and removed after,
// with this user's private directory in it.
class ScopedShmDir {
 public:
  // kPrivate: under $TEST_TMPDIR. kSharedLikeDevShm: under /dev/shm, mode 1777 like /dev/shm
  // itself, for tests in which another local user (tests/support/other_user.h) squats names there.
  enum class Kind { kPrivate, kSharedLikeDevShm };
  explicit ScopedShmDir(Kind kind = Kind::kPrivate) {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern = kind == Kind::kSharedLikeDevShm ? std::string("/dev/shm/cohort-test-shm.XXXXXX")
                                                          : std::string(base && *base ? base : "/tmp") + "/shm.XXXXXX";
    char* made = mkdtemp(pattern.data());
    if (made == nullptr) std::abort();
    path_ = made;
    if (kind == Kind::kSharedLikeDevShm && chmod(path_.c_str(), 01777) != 0) std::abort();
    const char* previous = std::getenv("COHORT_SHM_DIR");
    hadPrevious_ = previous != nullptr;
    if (hadPrevious_) previous_ = previous;
    setenv("COHORT_SHM_DIR", path_.c_str(), 1);
  }
  ScopedShmDir(const ScopedShmDir&) = delete;
  ScopedShmDir& operator=(const ScopedShmDir&) = delete;
  ~ScopedShmDir() {
    const std::string privateDir = path_ + "/cohort-" + std::to_string(geteuid());  // ipc/private_dir.h
    emptyDirectory(privateDir);
    rmdir(privateDir.c_str());
    emptyDirectory(path_);
    rmdir(path_.c_str());
    if (hadPrevious_) {
      setenv("COHORT_SHM_DIR", previous_.c_str(), 1);
    } else {
      unsetenv("COHORT_SHM_DIR");
    }
  }
  const std::string& path() const { return path_; }
  // Where this user's segments and claims go: path()/cohort-<euid> (ipc/private_dir.h), made (0700)
  // when missing so that a test can put files there first.
  std::string privatePath() const {
    const std::string dir = path_ + "/cohort-" + std::to_string(geteuid());
    mkdir(dir.c_str(), 0700);
    return dir;
  }

 private:
  // Removes what is in `dir`, subdirectories too (another user's, in the multi-user tests).
  static void emptyDirectory(const std::string& dir) {
    if (DIR* d = opendir(dir.c_str())) {
      while (dirent* e = readdir(d)) {
        std::string name = e->d_name;
        if (name == "." || name == "..") continue;
        const std::string path = dir + "/" + name;
        if (unlink(path.c_str()) != 0 && (errno == EISDIR || errno == EPERM)) {
          emptyDirectory(path);
          rmdir(path.c_str());
        }
      }
      closedir(d);
    }
  }

  std::string path_;
  std::string previous_;
  bool hadPrevious_ = false;
};

// The names in `dir` (without "." and ".."); none when it cannot be read.
inline std::vector<std::string> listDirectory(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(d);
  }
  return names;
}

// "test-<pid>-<random>-<counter>": unique per call within the test binary and across concurrent
// binaries, also those Bazel runs in pid namespaces of their own (where pids repeat).
inline std::string freshJobId() {
  static const unsigned salt = std::random_device{}();
  static std::atomic<int> counter{0};
  return "test-" + std::to_string(getpid()) + "-" + std::to_string(salt) + "-" + std::to_string(counter++);
}

// Forks a child that runs `body` and _exit()s with its result (see the file comment).
inline pid_t forkChild(const std::function<int()>& body) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid != 0) return pid;
  int code = 99;
  try {
    code = body();
  } catch (const cohort::Error& e) {
    std::fprintf(stderr, "[child %d] %s\n", getpid(), e.what());
    code = static_cast<int>(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[child %d] unexpected exception: %s\n", getpid(), e.what());
  }
  std::fflush(nullptr);
  _exit(code);
}

// The child's exit code, -SIGNAL when a signal ended it, or -1000 when it did not finish within
// `timeout` (it is then killed and reaped).
inline int waitChild(pid_t pid, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (true) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0) return -2000;
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      std::fprintf(stderr, "child %d did not finish within %lld ms: killed\n", pid,
                   static_cast<long long>(timeout.count()));
      return -1000;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (WIFSIGNALED(status)) return -WTERMSIG(status);
  return WEXITSTATUS(status);
}

}  // namespace cohort::ipc::testing
