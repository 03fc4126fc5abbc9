#include "launcher/mps_daemon.h"

#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <thread>

#include "launcher/mps_probe.h"       // environmentValue
#include "launcher/signal_channel.h"  // unblockAllSignalsInChild
#include "launcher/worker_process.h"  // ExitStatus, toCStrings
#include "runtime/error.h"
#include "runtime/unique_fd.h"

namespace cohort::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// How often the waits look again; none of them is on a hot path.
constexpr std::chrono::milliseconds kPollInterval{10};

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os << static_cast<double>(ms.count()) / 1000.0 << " s";
  return os.str();
}

// The first executable `program` in the directories of PATH (of `environment`), or "".
std::string findOnPath(const std::string& program, const std::vector<std::string>& environment) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0 ? program : "";
  std::stringstream path(environmentValue(environment, "PATH").value_or("/usr/local/bin:/usr/bin:/bin"));
  for (std::string dir; std::getline(path, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return "";
}

struct HelperRun {
  std::vector<std::string> argv;         // argv[0]: the program's path
  std::vector<std::string> environment;  // the whole environment
  std::string input;                     // written to its stdin (at most a pipe's buffer); "": /dev/null
  std::string outputPath;                // its stdout and stderr, appended
  bool createOutput = false;             // the first run creates outputPath (O_EXCL)
  std::chrono::milliseconds timeout;
};

// Runs a helper to its end in a process group of its own (a terminal's Ctrl-C reaches cohortrun,
// which must still be able to stop the daemon), with signals unblocked. Returns its status, or
// nullopt when it ran past the timeout: then its group is SIGKILLed and it is reaped.
std::optional<ExitStatus> runHelper(const HelperRun& run) {
  int in[2] = {-1, -1};
  if (!run.input.empty()) {
    if (::pipe2(in, O_CLOEXEC) != 0) COHORT_THROW(Error) << "pipe2: " << std::strerror(errno);
    (void)!::write(in[1], run.input.data(), run.input.size());
    ::close(in[1]);
  } else {
    in[0] = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  runtime::UniqueFd input(in[0]);
  // Never through a symlink, and created by this run or an earlier one of this job only.
  const int create = run.createOutput ? O_CREAT | O_EXCL : 0;
  runtime::UniqueFd output(::open(run.outputPath.c_str(), O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC | create, 0600));
  if (!input || !output) COHORT_THROW(IoError) << run.outputPath << ": " << std::strerror(errno);
  std::vector<char*> argv = toCStrings(run.argv), envp = toCStrings(run.environment);
  const pid_t pid = ::fork();
  if (pid < 0) COHORT_THROW(Error) << "fork: " << std::strerror(errno);
  if (pid == 0) {
    ::setpgid(0, 0);
    unblockAllSignalsInChild();
    for (int sig : {SIGPIPE, SIGHUP, SIGINT, SIGTERM}) ::signal(sig, SIG_DFL);
    if (::dup2(input.get(), 0) < 0 || ::dup2(output.get(), 1) < 0 || ::dup2(output.get(), 2) < 0) ::_exit(127);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  const auto deadline = Clock::now() + run.timeout;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      return WIFSIGNALED(status) ? ExitStatus{.signal = WTERMSIG(status)} : ExitStatus{.code = WEXITSTATUS(status)};
    }
    if (r < 0 && errno != EINTR) return ExitStatus{.code = 1};
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  ::kill(-pid, SIGKILL);
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  return std::nullopt;
}

// The last non-empty line of a text file, or "".
std::string lastLine(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last;
}

// Removes `path` and everything below it, as far as it can (stop() checks what is left).
void removeTree(const std::string& path) {
  auto removeOne = [](const char* p, const struct stat*, int, FTW*) {
    ::remove(p);
    return 0;
  };
  ::nftw(path.c_str(), removeOne, 16, FTW_DEPTH | FTW_PHYS);
}

// A process that has not exited: a zombie counts as gone (its reaper is not cohortrun).
bool processRunning(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');  // the command name may contain spaces and parentheses
  return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] != 'Z';
}

// True when /proc/<pid>/comm names an MPS program (the kernel keeps 15 characters of the file's
// name: "nvidia-cuda-mps"): a pid read from a file is killed only then.
bool isMpsProcess(pid_t pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(comm, name);
  return name.rfind("nvidia-cuda-mps", 0) == 0;
}

}  // namespace

bool isMpsVariable(const std::string& entry) {
  return entry.rfind("CUDA_MPS_PIPE_DIRECTORY=", 0) == 0 || entry.rfind("CUDA_MPS_LOG_DIRECTORY=", 0) == 0;
}

MpsDaemon::MpsDaemon(const MpsDaemonOptions& options, std::string programPath, std::string directory)
    : options_(options),
      programPath_(std::move(programPath)),
      directory_(std::move(directory)),
      pipeDirectory_(directory_ + "/mps-pipe"),
      logDirectory_(directory_ + "/mps-log"),
      variables_{"CUDA_MPS_PIPE_DIRECTORY=" + pipeDirectory_, "CUDA_MPS_LOG_DIRECTORY=" + logDirectory_} {
  // The helpers get this job's two variables in place of any inherited ones.
  std::erase_if(options_.environment, isMpsVariable);
  options_.environment.insert(options_.environment.end(), variables_.begin(), variables_.end());
}

std::unique_ptr<MpsDaemon> MpsDaemon::start(const MpsDaemonOptions& options) {
  const std::string path = findOnPath(options.program, options.environment);
  if (path.empty()) {
    COHORT_THROW(InvalidArgument) << "--mps: " << options.program
                                  << " was not found on PATH (it comes with NVIDIA's driver; or leave --mps out and "
                                     "start MPS yourself, docs/gpu.md)";
  }
  // mkdtemp: a fresh 0700 directory of an unpredictable name, so that no other user can make it
  // first (a directory of theirs would be adopted, its files theirs to replace: issue 44).
  std::string made = options.jobDirectory + "-XXXXXX";
  if (::mkdtemp(made.data()) == nullptr) {
    COHORT_THROW(InvalidArgument) << "--mps: cannot create a directory " << made << ": " << std::strerror(errno)
                                  << " (set TMPDIR to a writable directory)";
  }
  std::unique_ptr<MpsDaemon> daemon(new MpsDaemon(options, path, made));  // from here, a throw stops it
  for (const std::string& dir : {daemon->pipeDirectory_, daemon->logDirectory_}) {
    if (::mkdir(dir.c_str(), 0700) != 0) {
      COHORT_THROW(InvalidArgument) << "--mps: cannot create " << dir << ": " << std::strerror(errno);
    }
  }
  daemon->awaitControl();
  return daemon;
}

void MpsDaemon::awaitControl() {
  const auto deadline = Clock::now() + options_.timeout;
  const std::string out = directory_ + "/mps-control.out";
  std::optional<ExitStatus> status = runHelper({.argv = {programPath_, "-d"},
                                                .environment = options_.environment,
                                                .input = "",
                                                .outputPath = out,
                                                .createOutput = true,
                                                .timeout = options_.timeout});
  if (status && !status->ok()) {
    const std::string said = lastLine(out);
    COHORT_THROW(InvalidArgument) << "--mps: " << programPath_ << " -d " << status->describe()
                                  << (said.empty() ? "" : ": " + said);
  }
  const std::string control = pipeDirectory_ + "/control";
  while (::access(control.c_str(), F_OK) != 0) {
    if (!status || Clock::now() >= deadline) {
      std::string said = lastLine(logDirectory_ + "/control.log");
      if (said.empty()) said = lastLine(out);
      const bool tooLong = (pipeDirectory_ + "/control_privileged").size() >= 108;  // sockaddr_un's sun_path
      COHORT_THROW(InvalidArgument) << "--mps: the MPS control daemon did not create " << control << " within "
                                    << seconds(options_.timeout)
                                    << (tooLong ? " (the path is too long for a unix socket: set TMPDIR to a shorter "
                                                  "directory)"
                                                : "")
                                    << (said.empty() ? "" : "; it said: " + said);
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

std::vector<std::string> MpsDaemon::stop() {
  std::vector<std::string> warnings;
  if (stopped_) return warnings;
  stopped_ = true;
  try {
    runQuit(warnings);
    awaitDaemonExit(warnings);
  } catch (const Error& e) {
    warnings.push_back(std::string("stopping the MPS daemon: ") + e.what());
  }
  removeTree(directory_);
  if (::access(directory_.c_str(), F_OK) == 0) warnings.push_back("could not remove " + directory_);
  return warnings;
}

void MpsDaemon::runQuit(std::vector<std::string>& warnings) {
  if (::access((pipeDirectory_ + "/control").c_str(), F_OK) != 0) return;  // nothing to talk to
  std::optional<ExitStatus> status = runHelper({.argv = {programPath_},
                                                .environment = options_.environment,
                                                .input = "quit\n",
                                                .outputPath = directory_ + "/mps-control.out",
                                                .timeout = options_.timeout});
  if (!status) {
    warnings.push_back("'echo quit | " + programPath_ + "' did not finish within " + seconds(options_.timeout));
  } else if (!status->ok()) {
    warnings.push_back("'echo quit | " + programPath_ + "' " + status->describe());
  }
}

void MpsDaemon::awaitDaemonExit(std::vector<std::string>& warnings) {
  std::ifstream pidFile(pipeDirectory_ + "/nvidia-cuda-mps-control.pid");
  pid_t pid = 0;
  if (!(pidFile >> pid) || pid <= 0) return;  // the daemon never wrote it
  const auto deadline = Clock::now() + options_.timeout;
  while (processRunning(pid)) {
    if (Clock::now() >= deadline) {
      if (!isMpsProcess(pid)) return;  // the pid now names another program
      warnings.push_back("the MPS control daemon (pid " + std::to_string(pid) + ") was still running " +
                         seconds(options_.timeout) + " after quit; sending SIGKILL");
      ::kill(pid, SIGKILL);
      return;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

MpsDaemon::~MpsDaemon() { stop(); }

}  // namespace cohort::launcher
