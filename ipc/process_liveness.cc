#include "ipc/process_liveness.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>

namespace cohort::ipc {

std::optional<ProcStat> parseProcStat(const std::string& statText) {
  // "pid (comm) state ppid ..." — comm is free text, so fields are counted after the last ')'.
  size_t close = statText.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(statText.substr(close + 1));
  std::string field;
  ProcStat stat;
  if (!(rest >> field) || field.size() != 1) return std::nullopt;  // field 3
  stat.state = field[0];
  for (int i = 4; i < 22; ++i) {
    if (!(rest >> field)) return std::nullopt;
    if (i == 4) stat.parent = static_cast<pid_t>(std::strtol(field.c_str(), nullptr, 10));
    if (i == 5) stat.group = static_cast<pid_t>(std::strtol(field.c_str(), nullptr, 10));
  }
  if (!(rest >> field)) return std::nullopt;  // field 22
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(field.c_str(), &end, 10);
  if (errno != 0 || end == field.c_str() || *end != '\0') return std::nullopt;
  stat.startTicks = static_cast<uint64_t>(v);
  return stat;
}

std::optional<ProcStat> readProcStat(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return parseProcStat(text.str());
}

std::optional<uint64_t> processStartTicks(pid_t pid) {
  std::optional<ProcStat> stat = readProcStat(pid);
  if (!stat) return std::nullopt;
  return stat->startTicks;
}

bool processIsAlive(pid_t pid, uint64_t startTicks) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::optional<ProcStat> stat = readProcStat(pid);
  // kill() succeeded (or was refused with EPERM: the process exists but belongs to someone else), yet
  // /proc may be unreadable (hidepid) — then trust kill().
  if (!stat) return kill(pid, 0) == 0 || errno != ESRCH;
  // A zombie has exited; it only waits for its parent to reap it. A worker's peers are usually
  // siblings, so the launcher, not they, reaps it, and they must not wait for that to notice.
  if (stat->state == 'Z' || stat->state == 'X') return false;
  return startTicks == 0 || stat->startTicks == startTicks;
}

bool isAncestorOfThisProcess(pid_t ancestor) {
  if (ancestor <= 1) return false;
  pid_t p = getppid();
  for (int generation = 0; generation < 64 && p > 1; ++generation) {
    if (p == ancestor) return true;
    std::optional<ProcStat> stat = readProcStat(p);
    if (!stat) return false;
    p = stat->parent;
  }
  return false;
}

namespace {

// Whether a process whose thread-group leader reads as exited ('Z') still has threads of it running.
// The leader's /proc/<pid>/stat says 'Z' as soon as the main thread is gone, while the process's
// other threads may still be exiting (one blocked writing a checkpoint, say); they share its open
// files (a rank's claim, a checkpoint's lock) until the last of them ends. Each thread is
// /proc/<pid>/task/<tid>; a process that is wholly gone has only its leader there, a zombie.
bool otherThreadsRemain(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(tasks.c_str()), ::closedir);
  if (!dir) return false;
  while (dirent* e = ::readdir(dir.get())) {
    char* end = nullptr;
    const long tid = std::strtol(e->d_name, &end, 10);
    if (tid <= 0 || *end != '\0' || tid == pid) continue;
    std::ifstream in(tasks + "/" + e->d_name + "/stat");
    std::stringstream text;
    text << in.rdbuf();
    std::optional<ProcStat> stat = parseProcStat(text.str());
    if (stat && stat->state != 'Z' && stat->state != 'X') return true;
  }
  return false;
}

}  // namespace

bool groupHasLiveMember(pid_t group) {
  if (group <= 0) return false;
  if (::kill(-group, 0) != 0 && errno == ESRCH) return false;
  std::unique_ptr<DIR, int (*)(DIR*)> proc(::opendir("/proc"), ::closedir);
  if (!proc) return true;  // kill() says the group exists; without /proc, trust it
  while (dirent* e = ::readdir(proc.get())) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::optional<ProcStat> stat = readProcStat(static_cast<pid_t>(pid));
    if (!stat || stat->group != group) continue;
    if ((stat->state != 'Z' && stat->state != 'X') || otherThreadsRemain(static_cast<pid_t>(pid))) return true;
  }
  return false;
}

std::string thisHost() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown host";
  return host;
}

}  // namespace cohort::ipc
