#include "ipc/rank_claim.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <sstream>

#include "ipc/process_liveness.h"
#include "ipc/shm_names.h"
#include "runtime/error.h"

namespace cohort::ipc {

namespace {

// FNV-1a: a stable hash (the same in every build), for job ids too long for a socket name.
uint64_t stableHash(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

sockaddr_un addressOf(const std::string& name, socklen_t& length) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  // Abstract: sun_path[0] is NUL and the name is the next `name.size()` bytes, no terminator.
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return address;
}

runtime::UniqueFd newSocket() {
  runtime::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) COHORT_THROW(IoError) << "cannot make the socket that claims this process's rank: " << std::strerror(errno);
  return fd;
}

// The pid of the process listening on `name`, when it can be learnt.
std::optional<pid_t> holderOf(const std::string& name) {
  runtime::UniqueFd fd = newSocket();
  socklen_t length = 0;
  const sockaddr_un address = addressOf(name, length);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), length) != 0) return std::nullopt;
  ucred credentials{};
  socklen_t size = sizeof credentials;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0 || credentials.pid <= 0) {
    return std::nullopt;
  }
  return credentials.pid;
}

}  // namespace

// The shared-memory directory's identity (device and inode): jobs collide only where they would
// share segments. Containers with their own /dev/shm but the host's network (so the same abstract
// sockets) and pid numbers that repeat (so the same default job ids) do not refuse each other.
std::string shmDomain() {
  struct stat st {};
  if (::stat(shmDirectory().c_str(), &st) != 0) return "0:0";
  return std::to_string(static_cast<unsigned long long>(st.st_dev)) + ":" +
         std::to_string(static_cast<unsigned long long>(st.st_ino));
}

std::string RankClaim::nameFor(const std::string& jobId, int rank) {
  constexpr size_t kMaxName = sizeof(sockaddr_un::sun_path) - 1;
  const std::string domain = "cohort-rank/" + shmDomain() + "/";
  std::string name = domain + jobId + "/" + std::to_string(rank);
  if (name.size() <= kMaxName) return name;
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(stableHash(jobId)));
  return domain + "#" + std::string(hash) + "/" + std::to_string(rank);
}

RankClaim RankClaim::take(const std::string& jobId, int rank, const std::string& jobIdSource) {
  const std::string name = nameFor(jobId, rank);
  runtime::UniqueFd fd = newSocket();
  socklen_t length = 0;
  const sockaddr_un address = addressOf(name, length);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), length) == 0) {
    // Listening lets a refused process learn who holds the rank; nothing is ever accepted.
    if (::listen(fd.get(), 1) != 0) COHORT_THROW(IoError) << "listen on " << name << ": " << std::strerror(errno);
    return RankClaim(std::move(fd));
  }
  if (errno != EADDRINUSE) COHORT_THROW(IoError) << "cannot claim rank " << rank << " (" << name << "): " << std::strerror(errno);
  const std::optional<pid_t> holder = holderOf(name);
  std::ostringstream os;
  os << "rank " << rank << " of job " << (jobIdSource.empty() ? "id " + jobId : jobIdSource) << " on " << thisHost()
     << " is already held by "
     << (holder ? "process " + std::to_string(*holder) + ", which is still running" : "another running process")
     << ": two jobs were started with the same job id. Give every job its own id, or let the other job end first";
  throw InvalidArgument(os.str());
}

}  // namespace cohort::ipc
