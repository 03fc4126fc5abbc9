#include "tests/launcher/launcher_test_support.h"

#include "tests/support/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace cohort::launcher::testing {

using cohort::testing::runfile;
namespace {

using Clock = std::chrono::steady_clock;

bool isJobVariable(const std::string& entry) {
  static const char* const kPrefixes[] = {
      "RANK=",  "LOCAL_RANK=", "WORLD_SIZE=",     "LOCAL_WORLD_SIZE=", "COHORT_", "OMPI_COMM_WORLD_",
      "SLURM_", "PMI_",        "OMP_NUM_THREADS="};
  for (const char* p : kPrefixes) {
    if (entry.rfind(p, 0) == 0) return true;
  }
  return false;
}

// The state letter of /proc/PID/stat (R, S, T, Z, ...), or 0 when there is no such process.
char processState(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  size_t paren = text.rfind(')');  // the command name may contain spaces and parentheses
  return paren != std::string::npos && paren + 2 < text.size() ? text[paren + 2] : 0;
}

// Polls `cond` every 10 ms up to `timeout`.
bool pollUntil(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!cond()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// Appends what is readable; false at end of file.
bool drain(int fd, std::string& into) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      into.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && errno == EAGAIN;
  }
}

}  // namespace

std::string cohortrun() { return runfile("launcher/cohortrun"); }
std::string testWorker() { return runfile("tests/launcher/test_worker"); }

std::string Output::describe() const {
  std::ostringstream os;
  os << "exit code " << exitCode << ", signal " << signal << "\n--- stdout ---\n"
     << out << "--- stderr ---\n"
     << err << "--------------";
  return os.str();
}

Child Child::start(const std::vector<std::string>& argv, const std::vector<std::string>& extraEnv,
                   const StartOptions& options) {
  // An extra "NAME=value" replaces an inherited NAME (getenv would return the first of two).
  auto overridden = [&](const std::string& entry) {
    const std::string name = entry.substr(0, entry.find('=') + 1);
    return std::any_of(extraEnv.begin(), extraEnv.end(), [&](const std::string& e) { return e.rfind(name, 0) == 0; });
  };
  std::vector<std::string> envStrings;
  for (char** e = environ; *e; ++e) {
    if (!isJobVariable(*e) && !overridden(*e)) envStrings.emplace_back(*e);
  }
  envStrings.insert(envStrings.end(), extraEnv.begin(), extraEnv.end());
  std::vector<char*> args, env;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  for (const std::string& e : envStrings) env.push_back(const_cast<char*>(e.c_str()));
  args.push_back(nullptr);
  env.push_back(nullptr);
  int out[2], err[2];
  Child child;
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2: " << std::strerror(errno);
    return child;
  }
  int devNull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const rlimit openFiles{options.openFilesSoft, options.openFilesHard};
  child.pid_ = ::fork();
  if (child.pid_ == 0) {
    if (options.ownProcessGroup) ::setpgid(0, 0);
    if (options.openFilesSoft != 0 && ::setrlimit(RLIMIT_NOFILE, &openFiles) != 0) ::_exit(126);
    ::dup2(devNull, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execve(args[0], args.data(), env.data());
    ::_exit(127);
  }
  ::close(devNull);
  ::close(out[1]);
  ::close(err[1]);
  child.outFd_ = out[0];
  child.errFd_ = err[0];
  ::fcntl(child.outFd_, F_SETFL, O_NONBLOCK);
  ::fcntl(child.errFd_, F_SETFL, O_NONBLOCK);
  if (child.pid_ < 0) ADD_FAILURE() << "fork: " << std::strerror(errno);
  return child;
}

Child::Child(Child&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)),
      outFd_(std::exchange(o.outFd_, -1)),
      errFd_(std::exchange(o.errFd_, -1)),
      reaped_(o.reaped_),
      output_(std::move(o.output_)) {}

Child::~Child() {
  closeFds();
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

void Child::closeFds() {
  if (outFd_ >= 0) ::close(outFd_);
  if (errFd_ >= 0) ::close(errFd_);
  outFd_ = errFd_ = -1;
}

bool Child::pumpOnce(int timeoutMs) {
  if (outFd_ < 0 && errFd_ < 0) return false;
  pollfd fds[2] = {{outFd_, POLLIN, 0}, {errFd_, POLLIN, 0}};
  if (::poll(fds, 2, timeoutMs) <= 0) return true;
  if (fds[0].revents && !drain(outFd_, output_.out)) {
    ::close(outFd_);
    outFd_ = -1;
  }
  if (fds[1].revents && !drain(errFd_, output_.err)) {
    ::close(errFd_);
    errFd_ = -1;
  }
  return true;
}

bool Child::readUntil(const std::function<bool(const Output&)>& done, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!done(output_)) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || !pumpOnce(static_cast<int>(std::min<long>(left, 100)))) {
      if (done(output_)) return true;
      ADD_FAILURE() << "the expected output did not come within " << timeout.count() << " ms\n" << output_.describe();
      return false;
    }
  }
  return true;
}

const Output& Child::finish(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (outFd_ >= 0 || errFd_ >= 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      ADD_FAILURE() << "timed out after " << timeout.count() << " ms; killing the child\n" << output_.describe();
      ::kill(pid_, SIGKILL);
      break;
    }
    pumpOnce(static_cast<int>(std::min<long>(left, 100)));
  }
  closeFds();
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  if (WIFEXITED(status)) output_.exitCode = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) output_.signal = WTERMSIG(status);
  return output_;
}

Output runLauncher(const std::vector<std::string>& args, const std::vector<std::string>& extraEnv) {
  std::vector<std::string> argv = {cohortrun()};
  argv.insert(argv.end(), args.begin(), args.end());
  Child child = Child::start(argv, extraEnv);
  return child.finish(std::chrono::seconds(60));
}

Output runInTerminal(const std::vector<std::string>& argv, const TerminalOptions& options) {
  Output result;
  std::vector<std::string> envStrings;
  for (char** e = environ; *e; ++e) {
    if (!isJobVariable(*e) && std::strncmp(*e, "TERM=", 5) != 0) envStrings.emplace_back(*e);
  }
  if (std::none_of(options.extraEnv.begin(), options.extraEnv.end(),
                   [](const std::string& e) { return e.rfind("TERM=", 0) == 0; })) {
    envStrings.push_back("TERM=xterm");
  }
  envStrings.insert(envStrings.end(), options.extraEnv.begin(), options.extraEnv.end());
  std::vector<char*> args, env;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  for (const std::string& e : envStrings) env.push_back(const_cast<char*>(e.c_str()));
  args.push_back(nullptr);
  env.push_back(nullptr);

  int master = -1, slave = -1;
  winsize size{};
  size.ws_row = 50;
  size.ws_col = static_cast<unsigned short>(options.columns);
  if (::openpty(&master, &slave, nullptr, nullptr, &size) != 0) {
    ADD_FAILURE() << "openpty: " << std::strerror(errno);
    return result;
  }
  termios mode{};
  ::tcgetattr(slave, &mode);
  mode.c_oflag &= ~static_cast<tcflag_t>(ONLCR);  // keep "\n" as written
  mode.c_lflag &= ~static_cast<tcflag_t>(ECHO);
  ::tcsetattr(slave, TCSANOW, &mode);
  ::fcntl(master, F_SETFD, FD_CLOEXEC);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // A session of its own with the terminal as its controlling terminal, like a login shell's.
    ::setsid();
    ::ioctl(slave, TIOCSCTTY, 0);
    ::dup2(slave, 0);
    ::dup2(slave, 1);
    ::dup2(slave, 2);
    if (slave > 2) ::close(slave);
    ::execve(args[0], args.data(), env.data());
    ::_exit(127);
  }
  ::close(slave);  // from now on the master reads EIO once the child's side is closed by all
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    ::close(master);
    return result;
  }
  const auto deadline = Clock::now() + options.timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      ADD_FAILURE() << "timed out after " << options.timeout.count() << " ms: " << argv[0] << "; output so far:\n"
                    << result.out;
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd fd{master, POLLIN, 0};
    if (::poll(&fd, 1, static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    if (fd.revents == 0) continue;
    char buf[65536];
    const ssize_t n = ::read(master, buf, sizeof buf);
    if (n > 0) {
      result.out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    break;  // EIO: no writer is left
  }
  ::close(master);
  int status = 0;
  if (::waitpid(pid, &status, 0) == pid) {
    if (WIFEXITED(status)) result.exitCode = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  }
  return result;
}

std::vector<pid_t> workerPids(const std::string& launcherStdout) {
  std::vector<pid_t> pids;
  for (const std::string& line : linesWith(launcherStdout, "] pid ")) {
    pids.push_back(static_cast<pid_t>(std::stol(line.substr(line.find("] pid ") + 6))));
  }
  return pids;
}

pid_t pidOfRank(const std::string& launcherStdout, int rank) {
  const std::string prefix = "[rank " + std::to_string(rank) + "] pid ";
  for (const std::string& line : linesWith(launcherStdout, prefix)) {
    if (line.rfind(prefix, 0) == 0) return static_cast<pid_t>(std::stol(line.substr(prefix.size())));
  }
  return -1;
}

std::string printedEnv(const std::string& launcherStdout, int rank, const std::string& name) {
  const std::string prefix = "[rank " + std::to_string(rank) + "] env " + name + "=";
  for (const std::string& line : linesWith(launcherStdout, prefix)) {
    if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
  }
  return "";
}

bool processGone(pid_t pid) {
  ::waitpid(pid, nullptr, WNOHANG);  // reaps it if it is an orphan reparented to this subreaper
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  return processState(pid) == 'Z';
}

bool waitUntilGone(pid_t pid, std::chrono::milliseconds timeout) {
  return pollUntil([pid] { return processGone(pid); }, timeout);
}

bool waitUntilStopped(pid_t pid, std::chrono::milliseconds timeout) {
  return pollUntil([pid] { return processState(pid) == 'T'; }, timeout);
}

std::vector<std::string> segmentFiles(const std::string& dir, const std::string& jobId) {
  std::vector<std::string> names;
  const std::string prefix = "cohort." + jobId + ".";
  const std::string privateDir = dir + "/cohort-" + std::to_string(::geteuid());  // ipc/private_dir.h
  if (DIR* d = ::opendir(privateDir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) names.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  return names;
}

}  // namespace cohort::launcher::testing
