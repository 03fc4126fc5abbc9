#include "ipc/rank_roster.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <iomanip>
#include <optional>
#include <sstream>
#include <utility>

#include "ipc/backoff.h"
#include "ipc/private_dir.h"
#include "ipc/process_liveness.h"
#include "ipc/shm_names.h"
#include "runtime/error.h"

namespace cohort::ipc {

namespace {
constexpr uint64_t kRosterMagic = 0x5254534f52484f43ull;  // "COHROSTR" read little-endian
constexpr auto kLivenessInterval = std::chrono::milliseconds(20);
constexpr int kMaxListedRanks = 16;

uint64_t ownStartTicks() { return processStartTicks(::getpid()).value_or(0); }
}  // namespace

struct alignas(64) RankRoster::Header {
  std::atomic<uint64_t> magic;
  std::atomic<uint64_t> localWorldSize;
  std::atomic<uint64_t> launcherPid;  // 0: no launcher (the workers were started otherwise)
  std::atomic<uint64_t> launcherStartTicks;
};

struct alignas(64) RankRoster::Slot {
  std::atomic<uint64_t> pid;  // 0: empty
  std::atomic<uint64_t> startTicks;
  std::atomic<uint64_t> launched;  // the process cohortrun forked for this rank, 0 without a launcher
  std::atomic<uint64_t> arrivals;  // arriveAndWait() calls so far
  std::atomic<uint32_t> state;     // RosterState
  std::atomic<int32_t> rank;       // the world rank, -1 unknown
};

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "roster slots must be lock-free across processes");

size_t RankRoster::bytesFor(uint64_t localWorldSize) {
  static_assert(sizeof(Header) == 64 && sizeof(Slot) == 64);
  return sizeof(Header) + static_cast<size_t>(localWorldSize) * sizeof(Slot);
}

bool RankRoster::holdsRoster() const {
  if (bytes_ < sizeof(Header)) return false;
  auto* header = static_cast<Header*>(memory_);
  const uint64_t n = header->localWorldSize.load();
  return header->magic.load() == kRosterMagic && n >= 1 && n <= kMaxLocalRanks && bytesFor(n) <= bytes_;
}

// flock() on a duplicate of the roster's descriptor, released by the destructor (and by the kernel
// when the holder dies), so a crashed holder never leaves the roster locked.
class RankRoster::Lock {
 public:
  Lock() = default;
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;
  ~Lock() { release(); }

  // false when `wait` is zero and another process holds it.
  bool acquire(int fd, std::chrono::milliseconds wait, const std::string& path) {
    release();
    runtime::UniqueFd dup(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    if (!dup) COHORT_THROW(IoError) << path << ": dup: " << std::strerror(errno);
    const auto deadline = std::chrono::steady_clock::now() + wait;
    Backoff backoff(std::chrono::milliseconds(1));
    while (::flock(dup.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) COHORT_THROW(IoError) << path << ": flock: " << std::strerror(errno);
      if (wait.count() == 0) return false;
      if (std::chrono::steady_clock::now() >= deadline) {
        COHORT_THROW(TimeoutError) << "the job's roster " << path << " stayed locked by another process for "
                                   << wait.count() / 1000.0 << " s";
      }
      backoff.pause();
    }
    fd_ = std::move(dup);
    return true;
  }
  void release() noexcept {
    if (fd_) ::flock(fd_.get(), LOCK_UN);
    fd_.reset();
  }

 private:
  runtime::UniqueFd fd_;
};

RankRoster::RankRoster(RankRoster&& other) noexcept
    : fd_(std::move(other.fd_)),
      memory_(std::exchange(other.memory_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      jobId_(std::move(other.jobId_)),
      path_(std::move(other.path_)),
      host_(std::move(other.host_)),
      localRank_(other.localRank_) {}

RankRoster& RankRoster::operator=(RankRoster&& other) noexcept {
  if (this != &other) {
    unmap();
    fd_ = std::move(other.fd_);
    memory_ = std::exchange(other.memory_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    jobId_ = std::move(other.jobId_);
    path_ = std::move(other.path_);
    host_ = std::move(other.host_);
    localRank_ = other.localRank_;
  }
  return *this;
}

RankRoster::~RankRoster() { unmap(); }

void RankRoster::map(size_t bytes) {
  unmap();
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
  if (m == MAP_FAILED) COHORT_THROW(IoError) << path_ << ": mmap of " << bytes << " bytes: " << std::strerror(errno);
  memory_ = m;
  bytes_ = bytes;
}

void RankRoster::unmap() noexcept {
  if (memory_) ::munmap(memory_, bytes_);
  memory_ = nullptr;
  bytes_ = 0;
}

RankRoster::Slot& RankRoster::slot(int localRank) const {
  auto* header = static_cast<Header*>(memory_);
  COHORT_CHECK(localRank >= 0 && static_cast<uint64_t>(localRank) < header->localWorldSize.load())
      << "local rank " << localRank << " of " << header->localWorldSize.load();
  return reinterpret_cast<Slot*>(static_cast<char*>(memory_) + sizeof(Header))[localRank];
}

// Opens (or creates) the file and locks it; retries when the name was removed or replaced while it
// waited for the lock, so that a process never joins a roster nobody else can find.
RankRoster RankRoster::openLocked(const std::string& jobId, std::chrono::milliseconds lockTimeout, Lock& lock) {
  RankRoster r;
  r.jobId_ = jobId;
  r.path_ = segmentPath(jobId, "roster");  // refuses a private directory of another user
  r.host_ = thisHost();
  for (;;) {
    // O_NONBLOCK: a FIFO planted by root is refused below, not waited on.
    r.fd_ = runtime::UniqueFd(::open(r.path_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600));
    if (!r.fd_) {
      const int err = errno;
      struct stat st {};
      if (err != ENOENT && ::lstat(r.path_.c_str(), &st) == 0) requireOwnRegularFile(st, r.path_, "job roster");
      COHORT_THROW(IoError) << "cannot open the job's roster " << r.path_ << ": " << std::strerror(err);
    }
    struct stat held {
    }, named{};
    if (::fstat(r.fd_.get(), &held) != 0) COHORT_THROW(IoError) << r.path_ << ": fstat: " << std::strerror(errno);
    requireOwnRegularFile(held, r.path_, "job roster");
    lock.acquire(r.fd_.get(), lockTimeout, r.path_);
    if (::stat(r.path_.c_str(), &named) == 0 && named.st_ino == held.st_ino && named.st_dev == held.st_dev) return r;
    lock.release();
  }
}

// Under the lock: a new file (or one whose maker died while laying it out) is laid out, and so is
// the launcher's always; a joiner finds a live roster of another size to be another job's. Returns
// whether it laid the roster out.
bool RankRoster::prepare(int localWorldSize, const JoinOptions* joiner) {
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) COHORT_THROW(IoError) << path_ << ": fstat: " << std::strerror(errno);
  bool fresh = st.st_size == 0 || joiner == nullptr;
  if (!fresh) {
    map(static_cast<size_t>(st.st_size));
    fresh = st.st_size >= static_cast<off_t>(sizeof(Header)) && static_cast<Header*>(memory_)->magic.load() == 0;
  }
  if (!fresh) {
    if (!holdsRoster())
      COHORT_THROW(IoError) << path_ << " is not a Cohort job roster (a foreign or damaged file: remove it)";
    const uint64_t size = static_cast<Header*>(memory_)->localWorldSize.load();
    if (size != static_cast<uint64_t>(localWorldSize)) {
      COHORT_THROW(InvalidArgument) << "job "
                                    << (joiner->jobIdSource.empty() ? "id " + joiner->jobId : joiner->jobIdSource)
                                    << ": this process is one of " << localWorldSize
                                    << " local ranks, but a running job of that id on " << host_ << " has " << size
                                    << " (" << describeMember(liveMemberOtherThan(::getpid()))
                                    << "): two jobs were started with the same job id; give every job its own";
    }
    return false;
  }
  unmap();
  if (::ftruncate(fd_.get(), 0) != 0 || ::ftruncate(fd_.get(), static_cast<off_t>(bytesFor(localWorldSize))) != 0) {
    COHORT_THROW(IoError) << "cannot size the job's roster " << path_ << ": " << std::strerror(errno);
  }
  map(bytesFor(localWorldSize));  // zeroed by the truncation: every slot empty, no launcher
  auto* header = static_cast<Header*>(memory_);
  header->localWorldSize.store(static_cast<uint64_t>(localWorldSize));
  for (int r = 0; r < localWorldSize; ++r) slot(r).rank.store(-1);
  header->magic.store(kRosterMagic, std::memory_order_release);
  return true;
}

// Under the lock: a laid-out roster none of whose processes (nor its launcher) lives or stays.
bool RankRoster::isLeftover() {
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Header))) return false;
  map(static_cast<size_t>(st.st_size));
  return holdsRoster() && liveMemberOtherThan(::getpid()) == -1;
}

int RankRoster::liveMemberOtherThan(pid_t self) const {
  auto* header = static_cast<Header*>(memory_);
  const auto launcher = static_cast<pid_t>(header->launcherPid.load());
  if (launcher != 0 && launcher != self && processIsAlive(launcher, header->launcherStartTicks.load()))
    return kLauncher;
  const auto n = static_cast<int>(header->localWorldSize.load());
  for (int r = 0; r < n; ++r) {
    const Slot& s = slot(r);
    const auto pid = static_cast<pid_t>(s.pid.load(std::memory_order_acquire));
    const auto state = static_cast<RosterState>(s.state.load(std::memory_order_acquire));
    if (pid == 0 || pid == self || state == RosterState::kFinished || state == RosterState::kAbandoned) continue;
    if (processIsAlive(pid, s.startTicks.load())) return r;
  }
  return -1;
}

std::string RankRoster::describeMember(int member) const {
  if (member == kLauncher)
    return "its launcher is process " + std::to_string(static_cast<Header*>(memory_)->launcherPid.load());
  const Slot& s = slot(member);
  const int rank = s.rank.load();
  return (rank >= 0 ? "rank " + std::to_string(rank) : "local rank " + std::to_string(member)) + " is process " +
         std::to_string(s.pid.load());
}

RankRoster RankRoster::createForLauncher(const std::string& jobId, int localWorldSize) {
  COHORT_CHECK(localWorldSize >= 1) << localWorldSize;
  Lock lock;
  RankRoster r = openLocked(jobId, std::chrono::seconds(10), lock);
  r.prepare(localWorldSize, nullptr);
  auto* header = static_cast<Header*>(r.memory_);
  header->launcherStartTicks.store(ownStartTicks());
  header->launcherPid.store(static_cast<uint64_t>(::getpid()), std::memory_order_release);
  return r;
}

void RankRoster::recordStarted(int localRank, pid_t pid) {
  Slot& s = slot(localRank);
  s.launched.store(static_cast<uint64_t>(pid), std::memory_order_release);
  if (s.pid.load(std::memory_order_acquire) != 0) return;  // it (or its child) joined already
  s.rank.store(localRank);
  s.startTicks.store(processStartTicks(pid).value_or(0));
  s.state.store(static_cast<uint32_t>(RosterState::kStarted));
  s.pid.store(static_cast<uint64_t>(pid), std::memory_order_release);
}

RankRoster RankRoster::join(const JoinOptions& o) {
  if (o.localRank < 0 || o.localRank >= o.localWorldSize) {
    COHORT_THROW(InvalidArgument) << "local rank " << o.localRank << " of " << o.localWorldSize;
  }
  for (;;) {
    Lock lock;
    RankRoster r = openLocked(o.jobId, o.lockTimeout, lock);
    if (r.isLeftover()) {
      // Left by a crash or an earlier job of this id, of which no process lives here: its segments
      // go with it (a rank of this job could otherwise open one of them before local rank 0 makes
      // its own), and the roster starts afresh.
      removeJobSegments(o.jobId);
      continue;
    }
    // The first rank of this job here: what its id left on the node was left by a crash.
    if (r.prepare(o.localWorldSize, &o)) removeOrphanedSegments(o.jobId);
    r.claim(o);
    // Like every segment of a job, the name goes once every local rank has it: the mapping is all
    // the ranks need from then on, and a node whose workers are all killed leaves nothing behind.
    if (r.everyRankJoined()) r.unlink();
    return r;
  }
}

void RankRoster::claim(const JoinOptions& o) {
  Slot& s = slot(o.localRank);
  const auto self = static_cast<uint64_t>(::getpid());
  const uint64_t holder = s.pid.load(std::memory_order_acquire);
  if (holder != 0 && holder != self && !mayTakeOver(s)) {
    // prepare() started a stale roster afresh, so the job of this id still runs here.
    const bool holderLives = processIsAlive(static_cast<pid_t>(holder), s.startTicks.load());
    std::ostringstream os;
    os << "rank " << o.rank << " of job " << (o.jobIdSource.empty() ? "id " + o.jobId : o.jobIdSource) << " on "
       << host_;
    if (holderLives) {
      os << " is already held by process " << holder << ", which is still running";
    } else {
      os << " was held by process " << holder << ", which has exited, but that job still runs here ("
         << describeMember(liveMemberOtherThan(static_cast<pid_t>(self))) << ")";
    }
    os << ": two jobs were started with the same job id. Give every job its own id, or let the other job end first";
    throw InvalidArgument(os.str());
  }
  localRank_ = o.localRank;
  s.rank.store(o.rank);
  if (holder != self) {
    s.arrivals.store(0);
    s.startTicks.store(ownStartTicks());
  }
  s.state.store(static_cast<uint32_t>(RosterState::kJoined));
  s.pid.store(self, std::memory_order_release);
}

// A process of the worker cohortrun started for this rank (that process, or a descendant: a
// wrapper script's child, a later program of the same script) takes the rank over from the process
// the launcher recorded, or from an earlier program of the worker that has left or is gone.
bool RankRoster::mayTakeOver(const Slot& s) const {
  const auto launched = static_cast<pid_t>(s.launched.load(std::memory_order_acquire));
  if (launched == 0 || (launched != ::getpid() && !isAncestorOfThisProcess(launched))) return false;
  const auto state = static_cast<RosterState>(s.state.load(std::memory_order_acquire));
  if (state == RosterState::kStarted || state == RosterState::kFinished || state == RosterState::kAbandoned)
    return true;
  return !processIsAlive(static_cast<pid_t>(s.pid.load()), s.startTicks.load());
}

void RankRoster::leave(bool finished) noexcept {
  if (!memory_ || localRank_ < 0) return;
  try {
    Lock lock;
    lock.acquire(fd_.get(), std::chrono::seconds(2), path_);
    const RosterState state = finished ? RosterState::kFinished : RosterState::kAbandoned;
    slot(localRank_).state.store(static_cast<uint32_t>(state), std::memory_order_release);
    // The last one out (no launcher): the job's names go, the roster's too; mappings stay valid.
    if (liveMemberOtherThan(::getpid()) == -1) removeJobSegments(jobId_);
  } catch (...) {
    // Leaving must not fail: at worst the name stays until the sweep or the next job of this id.
  }
}

void RankRoster::unlink() noexcept {
  struct stat held {
  }, named{};
  if (!fd_ || ::fstat(fd_.get(), &held) != 0 || ::stat(path_.c_str(), &named) != 0) return;
  if (named.st_ino == held.st_ino && named.st_dev == held.st_dev) ::unlink(path_.c_str());
}

void RankRoster::arriveAndWait(const std::string& what, std::chrono::milliseconds timeout) {
  COHORT_CHECK(localRank_ >= 0) << "arriveAndWait needs a joined roster";
  Slot& mine = slot(localRank_);
  const uint64_t arrival = mine.arrivals.load(std::memory_order_relaxed) + 1;
  mine.arrivals.store(arrival, std::memory_order_release);
  const auto start = std::chrono::steady_clock::now();
  auto nextCheck = start + kLivenessInterval;
  Backoff backoff;
  for (;;) {
    if (allArrived(arrival)) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= nextCheck) {
      checkMissing(arrival, what);
      nextCheck = now + kLivenessInterval;
    }
    if (now - start >= timeout && !allArrived(arrival)) throwTimeout(arrival, what, timeout);
    backoff.pause();
  }
}

bool RankRoster::allArrived(uint64_t arrival) const {
  const auto n = static_cast<int>(static_cast<Header*>(memory_)->localWorldSize.load());
  for (int r = 0; r < n; ++r) {
    if (slot(r).arrivals.load(std::memory_order_acquire) < arrival) return false;
  }
  return true;
}

// Why the rank of slot `s` will not arrive at meeting `arrival`, or nullptr: its state and liveness
// are read first and its arrivals after, since arrivals never grow once a rank has left.
const char* RankRoster::leftWithoutArriving(const Slot& s, uint64_t arrival) const {
  const auto pid = static_cast<pid_t>(s.pid.load(std::memory_order_acquire));
  if (pid == 0) return nullptr;
  const auto state = static_cast<RosterState>(s.state.load(std::memory_order_acquire));
  const char* left = state == RosterState::kFinished             ? "finished and left the job"
                     : state == RosterState::kAbandoned          ? "failed before the job finished,"
                     : !processIsAlive(pid, s.startTicks.load()) ? "exited before the job finished,"
                                                                 : nullptr;
  return left && s.arrivals.load(std::memory_order_acquire) < arrival ? left : nullptr;
}

// A verdict read without the lock is confirmed under it: a process taking a slot over (claim) writes
// the slot's fields under the lock, so a slot read there is never half written.
void RankRoster::checkMissing(uint64_t arrival, const std::string& what) const {
  const auto n = static_cast<int>(static_cast<Header*>(memory_)->localWorldSize.load());
  for (int r = 0; r < n; ++r) {
    const Slot& s = slot(r);
    if (r == localRank_ || !leftWithoutArriving(s, arrival)) continue;
    Lock lock;
    try {
      lock.acquire(fd_.get(), std::chrono::seconds(1), path_);
    } catch (const TimeoutError&) {
      return;  // judged again at the next look
    }
    if (const char* left = leftWithoutArriving(s, arrival)) {
      COHORT_THROW(PeerError) << "rank " << (s.rank.load() >= 0 ? s.rank.load() : r) << " (pid " << s.pid.load()
                              << " on " << host_ << ") " << left << " while rank " << slot(localRank_).rank.load()
                              << " waited at " << what;
    }
  }
}

void RankRoster::throwTimeout(uint64_t arrival, const std::string& what, std::chrono::milliseconds timeout) const {
  const auto n = static_cast<int>(static_cast<Header*>(memory_)->localWorldSize.load());
  std::ostringstream ranks, details;
  int count = 0;
  for (int r = 0; r < n; ++r) {
    const Slot& s = slot(r);
    if (s.arrivals.load(std::memory_order_acquire) >= arrival) continue;
    if (++count > kMaxListedRanks) continue;
    const int rank = s.rank.load() >= 0 ? s.rank.load() : r;
    ranks << (count > 1 ? ", " : "") << rank;
    const uint64_t pid = s.pid.load();
    details << "; local rank " << r << ": "
            << (pid == 0 ? "no process has started its job yet"
                         : "process " + std::to_string(pid) + ", running, has not reached it");
  }
  if (count > kMaxListedRanks) ranks << ", ...";
  COHORT_THROW(TimeoutError) << what << " timed out after " << std::fixed << std::setprecision(1)
                             << timeout.count() / 1000.0 << " s: rank" << (count == 1 ? " " : "s ") << ranks.str()
                             << " of " << n << " did not arrive (rank " << slot(localRank_).rank.load() << " waited"
                             << details.str() << ")";
}

std::vector<RosterEntry> RankRoster::entries() const {
  const auto n = static_cast<int>(static_cast<Header*>(memory_)->localWorldSize.load());
  std::vector<RosterEntry> out;
  for (int r = 0; r < n; ++r) {
    const Slot& s = slot(r);
    out.push_back({.localRank = r,
                   .rank = s.rank.load(),
                   .pid = static_cast<pid_t>(s.pid.load(std::memory_order_acquire)),
                   .state = static_cast<RosterState>(s.state.load(std::memory_order_acquire))});
  }
  return out;
}

RosterState RankRoster::stateOf(int localRank) const {
  return static_cast<RosterState>(slot(localRank).state.load(std::memory_order_acquire));
}

bool RankRoster::everyRankJoined() const {
  for (const RosterEntry& e : entries()) {
    if (e.state == RosterState::kEmpty || e.state == RosterState::kStarted) return false;
  }
  return true;
}

bool RankRoster::anyJoined() const {
  for (const RosterEntry& e : entries()) {
    if (e.state != RosterState::kEmpty && e.state != RosterState::kStarted) return true;
  }
  return false;
}

std::optional<RankRoster> RankRoster::openExisting(const std::string& path) {
  RankRoster r;
  r.path_ = path;
  r.host_ = thisHost();
  r.fd_ = runtime::UniqueFd(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  if (!r.fd_ || ::fstat(r.fd_.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
      static_cast<size_t>(st.st_size) < sizeof(Header)) {
    return std::nullopt;
  }
  r.map(static_cast<size_t>(st.st_size));
  if (!r.holdsRoster()) return std::nullopt;
  return r;
}

std::vector<RosterEntry> RankRoster::peek(const std::string& jobId) {
  std::optional<RankRoster> r = openExisting(privateDirectoryPath() + "/" + segmentName(jobId, "roster"));
  return r ? r->entries() : std::vector<RosterEntry>{};
}

bool RankRoster::removeIfStale(const std::string& path) {
  std::optional<RankRoster> r = openExisting(path);
  if (!r) return false;
  Lock lock;  // held while deciding and removing, so that no process joins in between
  if (!lock.acquire(r->fd_.get(), std::chrono::milliseconds(0), path)) return false;  // someone is joining
  if (r->liveMemberOtherThan(0) != -1) return false;  // every member counts, this process too
  r->unlink();
  return true;
}

}  // namespace cohort::ipc
