#include "ipc/shm_names.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "ipc/private_dir.h"
#include "ipc/process_liveness.h"
#include "ipc/rank_claim.h"
#include "ipc/rank_roster.h"
#include "ipc/segment_header.h"
#include "runtime/error.h"
#include "runtime/unique_fd.h"

namespace cohort::ipc {
namespace {

// A segment of a job that is not cohortrun's is only swept when its creator is gone AND it has not
// been modified for this long, so a creator that just exited while its peers are still attached (and
// about to remove it themselves) is not raced.
constexpr std::chrono::seconds kStaleGracePeriod{60};

bool isNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

std::optional<uint64_t> parseDecimal(const std::string& text) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno != 0) return std::nullopt;
  return static_cast<uint64_t>(v);
}

struct LauncherJob {
  pid_t pid;
  uint64_t startTicks;
  uint64_t pidNamespace;
};

// The inode of this process's pid namespace: pids (and so job ids) mean something only inside one.
// Containers or sandboxes that share /dev/shm but not a pid namespace must not judge each other's jobs.
uint64_t pidNamespaceId() {
  struct stat st;
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// "cr-<pid>-<start ticks>-<pid namespace inode>", nothing else.
std::optional<LauncherJob> parseLauncherJobId(const std::string& jobId) {
  if (jobId.rfind("cr-", 0) != 0) return std::nullopt;
  size_t dash1 = jobId.find('-', 3);
  if (dash1 == std::string::npos) return std::nullopt;
  size_t dash2 = jobId.find('-', dash1 + 1);
  if (dash2 == std::string::npos) return std::nullopt;
  std::optional<uint64_t> pid = parseDecimal(jobId.substr(3, dash1 - 3));
  std::optional<uint64_t> ticks = parseDecimal(jobId.substr(dash1 + 1, dash2 - dash1 - 1));
  std::optional<uint64_t> ns = parseDecimal(jobId.substr(dash2 + 1));
  if (!pid || !ticks || !ns || *pid == 0 || *pid > 0x7fffffff) return std::nullopt;
  return LauncherJob{static_cast<pid_t>(*pid), *ticks, *ns};
}

// The names in the private directory that start with `prefix`.
std::vector<std::string> listWithPrefix(const PrivateDirectory& dir, const std::string& prefix) {
  std::vector<std::string> names;
  runtime::UniqueFd copy(::fcntl(dir.fd.get(), F_DUPFD_CLOEXEC, 0));  // closedir closes it
  DIR* opened = copy ? ::fdopendir(copy.get()) : nullptr;
  if (!opened)
    COHORT_THROW(IoError) << "cannot list shared-memory directory " << dir.path << ": " << std::strerror(errno);
  copy.release();
  std::unique_ptr<DIR, int (*)(DIR*)> d(opened, closedir);
  ::rewinddir(d.get());  // the copy shares the original's position
  while (dirent* e = readdir(d.get())) {
    std::string name = e->d_name;
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  return names;
}

// A claim's socket (ipc/rank_claim.h) rather than a segment: removed only when nobody holds it.
bool isSocket(const PrivateDirectory& dir, const std::string& name) {
  struct stat st {};
  return ::fstatat(dir.fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISSOCK(st.st_mode);
}

// The job id inside "cohort.<jobId>.<name>", or "" when `file` does not have that form.
std::string jobIdOfSegment(const std::string& file) {
  const std::string prefix = "cohort.";
  size_t dot = file.find('.', prefix.size());
  if (file.rfind(prefix, 0) != 0 || dot == std::string::npos || dot == prefix.size()) return "";
  return file.substr(prefix.size(), dot - prefix.size());
}

// True when `path` is a regular file with a valid Cohort header whose creator is gone and that has
// not been modified for `grace`. Any doubt (unreadable, foreign, short) answers false.
bool creatorIsGone(const PrivateDirectory& dir, const std::string& name, std::chrono::seconds grace) {
  int fd = ::openat(dir.fd.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  SegmentHeader header{};
  bool readable = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                  pread(fd, &header, sizeof header, 0) == static_cast<ssize_t>(sizeof header);
  close(fd);
  if (!readable || st.st_uid != ::geteuid() || header.magic != kSegmentMagic) return false;
  auto modified = std::chrono::system_clock::from_time_t(st.st_mtim.tv_sec);
  if (std::chrono::system_clock::now() - modified < grace) return false;
  return !processIsAlive(header.creatorPid, header.creatorStartTicks);
}

}  // namespace

std::string shmDirectory() {
  const char* dir = std::getenv("COHORT_SHM_DIR");
  return (dir && *dir) ? std::string(dir) : std::string("/dev/shm");
}

std::string sanitizeJobId(const std::string& jobId) {
  std::string out = jobId;
  for (char& c : out) {
    if (!isNameChar(c)) c = '_';
  }
  return out;
}

std::string jobPrefix(const std::string& jobId) {
  if (jobId.empty()) COHORT_THROW(InvalidArgument) << "shared-memory job id is empty";
  return "cohort." + sanitizeJobId(jobId) + ".";
}

std::string segmentPath(const std::string& jobId, const std::string& name) {
  const std::string file = segmentName(jobId, name);
  return openPrivateDirectory().path + "/" + file;
}

std::string segmentName(const std::string& jobId, const std::string& name) {
  bool valid = !name.empty();
  for (char c : name) valid = valid && isNameChar(c);
  if (!valid) {
    COHORT_THROW(InvalidArgument) << "shared-memory segment name '" << name
                                  << "' must be non-empty and use only [A-Za-z0-9_-]";
  }
  return jobPrefix(jobId) + name;
}

std::string makeLauncherJobId() {
  pid_t pid = getpid();
  std::optional<uint64_t> ticks = processStartTicks(pid);
  if (!ticks) COHORT_THROW(IoError) << "cannot read the start time of process " << pid << " from /proc";
  return "cr-" + std::to_string(pid) + "-" + std::to_string(*ticks) + "-" + std::to_string(pidNamespaceId());
}

bool launcherJobIsGone(const std::string& jobId) {
  std::optional<LauncherJob> job = parseLauncherJobId(jobId);
  return job && job->pidNamespace == pidNamespaceId() && !processIsAlive(job->pid, job->startTicks);
}

std::vector<std::string> removeJobSegments(const std::string& jobId) {
  const PrivateDirectory dir = openPrivateDirectory();
  std::vector<std::string> names = listWithPrefix(dir, jobPrefix(jobId));
  if (RankClaim::prefixFor(jobId) != jobPrefix(jobId)) {
    for (const std::string& claim : listWithPrefix(dir, RankClaim::prefixFor(jobId))) names.push_back(claim);
  }
  std::vector<std::string> removed;
  for (const std::string& name : names) {
    if (isSocket(dir, name)) {
      if (RankClaim::removeIfStale(dir, name)) removed.push_back(name);
    } else if (::unlinkat(dir.fd.get(), name.c_str(), 0) == 0) {
      removed.push_back(name);
    } else if (errno != ENOENT) {
      COHORT_THROW(IoError) << "cannot remove shared-memory segment " << dir.path << "/" << name << ": "
                            << std::strerror(errno);
    }
  }
  return removed;
}

std::vector<std::string> removeOrphanedSegments(const std::string& jobId) {
  const PrivateDirectory dir = openPrivateDirectory();
  std::vector<std::string> removed;
  for (const std::string& name : listWithPrefix(dir, jobPrefix(jobId))) {
    if (creatorIsGone(dir, name, std::chrono::seconds(0)) && ::unlinkat(dir.fd.get(), name.c_str(), 0) == 0) {
      removed.push_back(name);
    }
  }
  return removed;
}

std::vector<std::string> sweepStaleSegments() {
  std::vector<std::string> removed;
  std::optional<PrivateDirectory> dir;
  std::vector<std::string> names;
  try {
    dir.emplace(openPrivateDirectory());
    names = listWithPrefix(*dir, "cohort.");
  } catch (const Error&) {
    return removed;  // a directory that is not ours, or unreadable, holds nothing we may sweep
  }
  for (const std::string& name : names) {
    std::string jobId = jobIdOfSegment(name);
    if (jobId.empty()) continue;
    if (isSocket(*dir, name)) {
      if (RankClaim::removeIfStale(*dir, name)) removed.push_back(name);
      continue;
    }
    // A cohortrun job's liveness is its launcher's; a live launcher's segments are never touched.
    // Another job's roster is stale when none of its processes lives (it removes itself, locked).
    if (!parseLauncherJobId(jobId) && name == segmentName(jobId, "roster")) {
      try {
        if (RankRoster::removeIfStale(dir->path + "/" + name)) removed.push_back(name);
      } catch (const Error&) {
        // Any doubt keeps it.
      }
      continue;
    }
    bool stale = parseLauncherJobId(jobId) ? launcherJobIsGone(jobId) : creatorIsGone(*dir, name, kStaleGracePeriod);
    if (stale && ::unlinkat(dir->fd.get(), name.c_str(), 0) == 0) removed.push_back(name);
  }
  return removed;
}

}  // namespace cohort::ipc
