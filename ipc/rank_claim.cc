#include "ipc/rank_claim.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "ipc/backoff.h"
#include "ipc/process_liveness.h"
#include "ipc/shm_names.h"
#include "runtime/error.h"
#include "runtime/user_name.h"

namespace cohort::ipc {

namespace {

// The socket is bound as "/proc/self/fd/<directory fd>/<name>" (a long COHORT_SHM_DIR never
// overflows sun_path's 108 bytes), so names are kept to this length; longer job ids are hashed.
constexpr size_t kMaxName = 80;
// Refused probes wait in the backlog (nothing is ever accepted); when it is full a probe learns
// only that the holder lives, not its pid.
constexpr int kBacklog = 64;
constexpr auto kTakeLockTimeout = std::chrono::seconds(10);
constexpr auto kSweepLockTimeout = std::chrono::seconds(1);

// FNV-1a: a stable hash (the same in every build), for job ids too long for a socket name.
uint64_t stableHash(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

sockaddr_un addressOf(int directory, const std::string& name, socklen_t& length) {
  const std::string path = "/proc/self/fd/" + std::to_string(directory) + "/" + name;
  sockaddr_un address{};
  COHORT_CHECK(path.size() < sizeof address.sun_path) << path;
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return address;
}

runtime::UniqueFd newSocket() {
  runtime::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) COHORT_THROW(IoError) << "cannot make the socket that claims this process's rank: " << std::strerror(errno);
  return fd;
}

// flock() on the private directory while a claim is taken or judged stale; released by the
// destructor, and by the kernel when the holder dies.
class DirectoryLock {
 public:
  DirectoryLock(const PrivateDirectory& dir, std::chrono::milliseconds timeout) : fd_(dir.fd.get()) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    Backoff backoff(std::chrono::milliseconds(1));
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR)
        COHORT_THROW(IoError) << dir.path << ": flock: " << std::strerror(errno);
      if (std::chrono::steady_clock::now() >= deadline) {
        COHORT_THROW(TimeoutError) << "the private shared-memory directory " << dir.path
                                   << " stayed locked by another process for "
                                   << std::chrono::duration<double>(timeout).count() << " s";
      }
      backoff.pause();
    }
  }
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  ~DirectoryLock() { ::flock(fd_, LOCK_UN); }

 private:
  int fd_;
};

// Throws InvalidArgument unless `name` in `dir` is a socket of this user (root may have put
// something else there; this user's jobs make nothing else of that name).
struct stat requireOwnSocket(const PrivateDirectory& dir, const std::string& name) {
  struct stat st {};
  if (::fstatat(dir.fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return st;  // gone: st_ino 0
  if (!S_ISSOCK(st.st_mode) || st.st_uid != ::geteuid()) {
    COHORT_THROW(InvalidArgument) << "the rank claim " << dir.path << "/" << name << " is not a socket of this user ("
                                  << runtime::describeUser(st.st_uid) << " owns it, mode 0" << std::oct << st.st_mode
                                  << "): its owner or an administrator must remove it";
  }
  return st;
}

struct Holder {
  bool alive = false;
  std::optional<pid_t> pid;  // when it could be learnt
};

// Who listens on `name`: a refused connection means nobody (its holder died; the file stayed).
Holder holderOf(const PrivateDirectory& dir, const std::string& name) {
  runtime::UniqueFd fd = newSocket();
  socklen_t length = 0;
  const sockaddr_un address = addressOf(dir.fd.get(), name, length);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    if (errno == ECONNREFUSED || errno == ENOENT) return {};
    if (errno == EAGAIN) return {.alive = true};  // a full backlog: a listener
    COHORT_THROW(IoError) << "cannot connect to the rank claim " << dir.path << "/" << name << ": "
                          << std::strerror(errno);
  }
  ucred credentials{};
  socklen_t size = sizeof credentials;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0 || credentials.pid <= 0) {
    return {.alive = true};
  }
  return {.alive = true, .pid = credentials.pid};
}

[[noreturn]] void refuse(const std::string& jobId, int rank, const std::string& jobIdSource, const Holder& holder) {
  std::ostringstream os;
  os << "rank " << rank << " of job " << (jobIdSource.empty() ? "id " + jobId : jobIdSource) << " on " << thisHost()
     << " is already held by "
     << (holder.pid ? "process " + std::to_string(*holder.pid) + ", which is still running" : "another running process")
     << ": two jobs were started with the same job id. Give every job its own id, or let the other job end first";
  throw InvalidArgument(os.str());
}

// Removes the claims in `dir` whose holders are gone (killed: a claim's file outlives a SIGKILLed
// holder). Every take does it, so a user's killed jobs leave at most their claims' empty entries in
// the user's own directory until the user's next job on the node (docs/security.md).
void removeDeadClaims(const PrivateDirectory& dir, const std::string& keep) {
  std::vector<std::string> names;
  {
    runtime::UniqueFd listing(::openat(dir.fd.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    DIR* d = listing ? ::fdopendir(listing.get()) : nullptr;
    if (d == nullptr) return;
    (void)listing.release();  // the DIR owns it now
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != keep && name.rfind("cohort.", 0) == 0 && name.find(".claim-") != std::string::npos) names.push_back(name);
    }
    ::closedir(d);
  }
  for (const std::string& name : names) RankClaim::removeIfStale(dir, name);
}

}  // namespace

std::string RankClaim::prefixFor(const std::string& jobId) {
  const std::string prefix = jobPrefix(jobId);
  if (prefix.size() + std::strlen("claim-2147483647") <= kMaxName) return prefix;
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(stableHash(sanitizeJobId(jobId))));
  return "cohort.h" + std::string(hash) + ".";
}

std::string RankClaim::nameFor(const std::string& jobId, int rank) {
  return prefixFor(jobId) + "claim-" + std::to_string(rank);
}

RankClaim RankClaim::take(const std::string& jobId, int rank, const std::string& jobIdSource) {
  RankClaim claim;
  claim.dir_ = openPrivateDirectory();
  const std::string name = nameFor(jobId, rank);
  const std::string path = claim.dir_.path + "/" + name;
  removeDeadClaims(claim.dir_, name);
  DirectoryLock lock(claim.dir_, kTakeLockTimeout);
  runtime::UniqueFd fd = newSocket();
  socklen_t length = 0;
  const sockaddr_un address = addressOf(claim.dir_.fd.get(), name, length);
  // Under the lock nobody else binds or removes the name, so a second bind after removing a
  // stale file succeeds.
  for (int attempt = 0; ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0; ++attempt) {
    if (errno != EADDRINUSE || attempt > 0) {
      COHORT_THROW(IoError) << "cannot claim rank " << rank << " (" << path << "): " << std::strerror(errno);
    }
    requireOwnSocket(claim.dir_, name);
    const Holder holder = holderOf(claim.dir_, name);
    if (holder.alive) refuse(jobId, rank, jobIdSource, holder);
    if (::unlinkat(claim.dir_.fd.get(), name.c_str(), 0) != 0 && errno != ENOENT) {
      COHORT_THROW(IoError) << "cannot remove the stale rank claim " << path << ": " << std::strerror(errno);
    }
  }
  // Listening lets a refused process learn who holds the rank; nothing is ever accepted.
  if (::listen(fd.get(), kBacklog) != 0) COHORT_THROW(IoError) << "listen on " << path << ": " << std::strerror(errno);
  const struct stat st = requireOwnSocket(claim.dir_, name);
  claim.name_ = name;
  claim.socket_ = std::move(fd);
  claim.device_ = st.st_dev;
  claim.inode_ = st.st_ino;
  return claim;
}

bool RankClaim::removeIfStale(const PrivateDirectory& dir, const std::string& name) noexcept {
  try {
    DirectoryLock lock(dir, kSweepLockTimeout);
    const struct stat st = requireOwnSocket(dir, name);
    if (st.st_ino == 0 || holderOf(dir, name).alive) return false;
    return ::unlinkat(dir.fd.get(), name.c_str(), 0) == 0;
  } catch (...) {
    return false;  // any doubt keeps it
  }
}

RankClaim::RankClaim(RankClaim&& other) noexcept { *this = std::move(other); }

RankClaim& RankClaim::operator=(RankClaim&& other) noexcept {
  if (this != &other) {
    release();
    dir_ = std::move(other.dir_);
    name_ = std::exchange(other.name_, std::string());
    socket_ = std::move(other.socket_);
    device_ = std::exchange(other.device_, 0);
    inode_ = std::exchange(other.inode_, 0);
  }
  return *this;
}

RankClaim::~RankClaim() { release(); }

// While this process listens nobody takes the name over, so a file of the same identity is ours.
void RankClaim::release() noexcept {
  if (!socket_ || name_.empty()) return;
  struct stat st {};
  if (::fstatat(dir_.fd.get(), name_.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_dev == device_ &&
      st.st_ino == inode_) {
    ::unlinkat(dir_.fd.get(), name_.c_str(), 0);
  }
  socket_.reset();
  name_.clear();
}

}  // namespace cohort::ipc
