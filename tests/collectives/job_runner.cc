#include "tests/collectives/job_runner.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "runtime/error.h"

namespace cohort::collectives::testing {

std::string freshDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string pattern =
      std::string(tmp && *tmp ? tmp : "/tmp") + "/" + tag + "." + std::to_string(counter++) + ".XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) std::abort();
  return pattern;
}

bool dirIsEmpty(const std::string& dir, std::string* listing) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return true;
  bool empty = true;
  const std::string privateDir = "cohort-" + std::to_string(geteuid());  // ipc/private_dir.h: stays
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (name == privateDir && dirIsEmpty(dir + "/" + name, listing)) continue;
    empty = false;
    if (listing) *listing += name + " ";
  }
  closedir(d);
  return empty;
}

namespace {

[[noreturn]] void execChild(const std::vector<std::string>& argv, const std::vector<std::string>& extraEnv,
                            const std::string& outputPath) {
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "COHORT_JOB_ID",
                           "COHORT_RESTART_COUNT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}) {
    unsetenv(name);
  }
  for (const auto& kv : extraEnv) putenv(strdup(kv.c_str()));
  int fd = ::open(outputPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  int devNull = ::open("/dev/null", O_RDONLY);
  if (fd < 0 || devNull < 0) _exit(127);
  dup2(devNull, 0);
  dup2(fd, 1);
  dup2(fd, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

}  // namespace

pid_t spawnJob(const std::vector<std::string>& argv, const std::vector<std::string>& extraEnv,
               const std::string& outputPath) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) execChild(argv, extraEnv, outputPath);
  return pid;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

JobResult runJob(const std::vector<std::string>& argv, const std::vector<std::string>& extraEnv,
                 std::chrono::milliseconds timeout) {
  const std::string outputPath = freshDir("job") + "/output.txt";
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = spawnJob(argv, extraEnv, outputPath);
  JobResult result;
  int code = waitChild(pid, timeout);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (code == -1000) {
    result.timedOut = true;
  } else if (code < 0) {
    result.signal = -code;
  } else {
    result.exitCode = code;
  }
  result.output = readFile(outputPath);
  return result;
}

}  // namespace cohort::collectives::testing
