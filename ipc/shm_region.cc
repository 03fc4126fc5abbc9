#include "ipc/shm_region.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <boost/interprocess/file_mapping.hpp>
#include <cerrno>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <utility>
#include <vector>

#include "ipc/backoff.h"
#include "ipc/private_dir.h"
#include "ipc/process_liveness.h"
#include "ipc/shm_names.h"
#include "runtime/error.h"
#include "runtime/unique_fd.h"

namespace cohort::ipc {
namespace {

namespace bip = boost::interprocess;

// Owns the descriptor of a file it was created as; closes it and unlinks the file unless kept.
class CreatedFile {
 public:
  CreatedFile(runtime::UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  CreatedFile(const CreatedFile&) = delete;
  CreatedFile& operator=(const CreatedFile&) = delete;
  ~CreatedFile() {
    fd_.reset();
    if (!keep_) ::unlink(path_.c_str());
  }
  int fd() const { return fd_.get(); }
  void keep() { keep_ = true; }

 private:
  runtime::UniqueFd fd_;
  std::string path_;
  bool keep_ = false;
};

// A read-only descriptor for probing `path`: empty when nothing is there yet. What this user's
// jobs did not make (a file of another owner, a symlink, a FIFO: only root can put one in the
// private directory) is refused at once (InvalidArgument naming it and its owner), never waited on.
runtime::UniqueFd openForProbe(const std::string& path) {
  runtime::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  if (!fd) {
    const int err = errno;
    if (err == ENOENT) return fd;
    if (::lstat(path.c_str(), &st) == 0) requireOwnRegularFile(st, path, "shared-memory segment");
    if (errno == ENOENT) return fd;  // removed meanwhile
    COHORT_THROW(IoError) << "cannot open shared-memory segment " << path << ": " << std::strerror(err);
  }
  if (::fstat(fd.get(), &st) != 0) {
    COHORT_THROW(IoError) << "cannot inspect shared-memory segment " << path << ": " << std::strerror(errno);
  }
  requireOwnRegularFile(st, path, "shared-memory segment");
  return fd;
}

std::string seconds(std::chrono::milliseconds d) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << d.count() / 1000.0 << " s";
  return os.str();
}

// Bytes an unprivileged process may still allocate in `dir` (root's reserve excluded); unlimited
// when statvfs is not supported there.
uint64_t availableBytes(const std::string& dir) {
  struct statvfs vfs {};
  if (statvfs(dir.c_str(), &vfs) != 0) return UINT64_MAX;
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

[[noreturn]] void throwNoSpace(const std::string& dir, const std::string& name, size_t need) {
  COHORT_THROW(IoError) << "not enough shared memory in " << dir << " for segment " << name << ": need " << need
                        << " bytes, " << availableBytes(dir) << " available (statvfs); enlarge " << dir
                        << " (e.g. docker run --shm-size) or point COHORT_SHM_DIR at a larger tmpfs";
}

// Sizes the file and reserves every page now, so that touching the mapping can never raise SIGBUS.
// First the free space that statvfs reports: a request that cannot fit fails without touching the
// file system (on a disk-backed COHORT_SHM_DIR, a failing fallocate may first fill the whole disk,
// hurting everyone else on it). Then fallocate(2), which catches what statvfs cannot (other
// processes taking space meanwhile). fallocate(2) rather than posix_fallocate(3): where the file
// system lacks fallocate, glibc's posix_fallocate emulates it by writing one byte per block, slowly;
// there the statvfs comparison is all we have.
void reserve(int fd, const std::string& dir, const std::string& name, size_t total) {
  if (availableBytes(dir) < total) throwNoSpace(dir, name, total);
  if (ftruncate(fd, static_cast<off_t>(total)) != 0) {
    if (errno == ENOSPC || errno == EFBIG) throwNoSpace(dir, name, total);
    COHORT_THROW(IoError) << "cannot size shared-memory segment " << dir << "/" << name << " to " << total
                          << " bytes: " << std::strerror(errno);
  }
  if (fallocate(fd, 0, 0, static_cast<off_t>(total)) == 0) return;
  int err = errno;
  if (err == ENOSPC || err == EFBIG) throwNoSpace(dir, name, total);
  if (err == EOPNOTSUPP || err == ENOSYS) return;  // statvfs said it fits
  COHORT_THROW(IoError) << "cannot reserve " << total << " bytes for shared-memory segment " << dir << "/" << name
                        << ": " << std::strerror(err);
}

// Reads the header of `fd`; false when the file is shorter than the header block.
bool readHeader(int fd, SegmentHeader& header) {
  return pread(fd, &header, sizeof header, 0) == static_cast<ssize_t>(sizeof header);
}

// The existing file at `path` blocks create(). Removes it when it is stale (unreadable or foreign
// leftovers in our namespace, a dead creator, or an older generation); throws when it is live.
void removeIfStale(const std::string& path, const std::string& name, uint64_t generation) {
  SegmentHeader header{};
  runtime::UniqueFd probe = openForProbe(path);
  bool valid = probe && readHeader(probe.get(), header) && header.magic == kSegmentMagic;
  if (valid && header.generation >= generation && processIsAlive(header.creatorPid, header.creatorStartTicks)) {
    COHORT_THROW(InvalidArgument) << "shared-memory segment " << path << " already exists, created by live process "
                                  << header.creatorPid << " for generation " << header.generation
                                  << " (this is generation " << generation
                                  << "); is another job running with the same job id?";
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    COHORT_THROW(IoError) << "cannot remove stale shared-memory segment " << path << ": " << std::strerror(errno);
  }
}

runtime::UniqueFd createExclusive(const std::string& path, const std::string& name, uint64_t generation) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    runtime::UniqueFd fd(::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (fd) return fd;
    if (errno != EEXIST) {
      COHORT_THROW(IoError) << "cannot create shared-memory segment " << path << ": " << std::strerror(errno);
    }
    removeIfStale(path, name, generation);
  }
  COHORT_THROW(InvalidArgument) << "shared-memory segment " << path
                                << " keeps reappearing: another process is creating it concurrently";
}

// The state of a segment as seen by an opener.
struct Probe {
  bool ready = false;
  std::string waitingFor;  // when not ready: what is missing, for the timeout message
  dev_t device = 0;
  ino_t inode = 0;
};

// Throws IoError when the header cannot belong to a Cohort segment that this opener may use.
void validateHeader(const SegmentHeader& h, const std::string& path, const ShmRegion::OpenOptions& o) {
  if (h.magic != kSegmentMagic) {
    COHORT_THROW(IoError) << path << " is not a Cohort shared-memory segment (bad magic 0x" << std::hex << h.magic
                          << ")";
  }
  if (h.layoutVersion != kSegmentLayoutVersion || h.headerBytes != kSegmentHeaderBytes) {
    COHORT_THROW(IoError) << "shared-memory segment " << path << " has layout version " << h.layoutVersion
                          << " and header size " << h.headerBytes << ", this build expects " << kSegmentLayoutVersion
                          << " and " << kSegmentHeaderBytes << " (are all ranks running the same build?)";
  }
  if (h.generation > o.generation) {
    COHORT_THROW(IoError) << "shared-memory segment " << path << " is of generation " << h.generation
                          << ", newer than this process's generation " << o.generation;
  }
  if (h.generation == o.generation && h.payloadBytes != o.payloadBytes) {
    COHORT_THROW(IoError) << "shared-memory segment " << path << " holds " << h.payloadBytes
                          << " payload bytes, this process expects " << o.payloadBytes
                          << " (do all ranks use the same model and options?)";
  }
}

Probe probe(const std::string& path, const ShmRegion::OpenOptions& o) {
  runtime::UniqueFd file = openForProbe(path);
  if (!file) return {false, "the segment does not exist yet"};
  struct stat st {};
  if (fstat(file.get(), &st) != 0) return {false, "the segment cannot be inspected yet"};  // checked in openForProbe
  SegmentHeader h{};
  if (st.st_size < static_cast<off_t>(kSegmentHeaderBytes) || !readHeader(file.get(), h) || h.magic == 0) {
    return {false, "the segment's header is not written yet"};
  }
  validateHeader(h, path, o);
  if (h.generation < o.generation) {
    return {false, "the segment is of the older generation " + std::to_string(h.generation)};
  }
  size_t total = kSegmentHeaderBytes + o.payloadBytes;
  if (static_cast<size_t>(st.st_size) < total) {
    return {false, "the segment is sized " + std::to_string(st.st_size) + " of " + std::to_string(total) + " bytes"};
  }
  if (h.ready.load(std::memory_order_relaxed) != 1) {
    if (!processIsAlive(h.creatorPid, h.creatorStartTicks)) {
      COHORT_THROW(PeerError) << "the creator of shared-memory segment " << path << " (pid " << h.creatorPid
                              << ") exited before publishing it";
    }
    return {false, "the segment is not published yet"};
  }
  return {true, "", st.st_dev, st.st_ino};
}

}  // namespace

ShmRegion ShmRegion::create(const CreateOptions& options) {
  const std::string dir = shmDirectory();
  ShmRegion r;
  r.name_ = segmentName(options.jobId, options.name);
  r.path_ = segmentPath(options.jobId, options.name);
  r.payloadBytes_ = options.payloadBytes;
  r.generation_ = options.generation;
  const size_t total = kSegmentHeaderBytes + options.payloadBytes;

  CreatedFile file(createExclusive(r.path_, r.name_, options.generation), r.path_);
  // The header goes in first (one write of the whole block, so an opener sees none or all of it),
  // so even a creator killed while sizing leaves a file that says whose it was.
  std::vector<unsigned char> block(kSegmentHeaderBytes, 0);
  auto* h = new (block.data()) SegmentHeader{};
  h->magic = kSegmentMagic;
  h->layoutVersion = kSegmentLayoutVersion;
  h->headerBytes = kSegmentHeaderBytes;
  h->payloadBytes = options.payloadBytes;
  h->generation = options.generation;
  h->creatorPid = getpid();
  h->creatorStartTicks = processStartTicks(getpid()).value_or(0);
  if (pwrite(file.fd(), block.data(), block.size(), 0) != static_cast<ssize_t>(block.size())) {
    if (errno == ENOSPC) throwNoSpace(dir, r.name_, total);
    COHORT_THROW(IoError) << "cannot write the header of shared-memory segment " << r.path_ << ": "
                          << std::strerror(errno);
  }
  reserve(file.fd(), dir, r.name_, total);
  struct stat st {};
  if (fstat(file.fd(), &st) != 0) {
    COHORT_THROW(IoError) << "cannot stat shared-memory segment " << r.path_ << ": " << std::strerror(errno);
  }
  r.device_ = st.st_dev;
  r.inode_ = st.st_ino;
  r.map(total);
  file.keep();
  r.isCreator_ = true;
  r.unlinkOnDestroy_ = options.unlinkOnDestroy;
  return r;
}

ShmRegion ShmRegion::open(const OpenOptions& options) {
  ShmRegion r;
  r.name_ = segmentName(options.jobId, options.name);
  r.path_ = segmentPath(options.jobId, options.name);  // refuses a private directory of another user
  r.payloadBytes_ = options.payloadBytes;
  r.generation_ = options.generation;
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  Backoff backoff;
  while (true) {
    Probe p = probe(r.path_, options);
    if (p.ready) {
      r.device_ = p.device;
      r.inode_ = p.inode;
      r.map(kSegmentHeaderBytes + options.payloadBytes);
      // The file may have been replaced between probe() and map(): trust only the mapped header.
      const SegmentHeader* h = r.header();
      if (h->ready.load(std::memory_order_acquire) == 1 && h->magic == kSegmentMagic &&
          h->generation == options.generation && h->payloadBytes == options.payloadBytes) {
        return r;
      }
      p.waitingFor = "the segment was replaced while being opened";
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      COHORT_THROW(TimeoutError) << "timed out after " << seconds(options.timeout) << " waiting for "
                                 << options.creatorDescription << " to publish shared-memory segment " << r.name_
                                 << " of job " << sanitizeJobId(options.jobId) << " in " << privateDirectoryPath()
                                 << ": " << p.waitingFor;
    }
    backoff.pause();
  }
}

void ShmRegion::map(size_t totalBytes) {
  try {
    bip::file_mapping file(path_.c_str(), bip::read_write);
    region_ = bip::mapped_region(file, bip::read_write, 0, totalBytes);
  } catch (const bip::interprocess_exception& e) {
    COHORT_THROW(IoError) << "cannot map shared-memory segment " << path_ << " (" << totalBytes
                          << " bytes): " << e.what();
  }
}

ShmRegion::ShmRegion(ShmRegion&& other) noexcept { *this = std::move(other); }

ShmRegion& ShmRegion::operator=(ShmRegion&& other) noexcept {
  if (this == &other) return *this;
  if (unlinkOnDestroy_ && nameStillRefersToUs()) ::unlink(path_.c_str());
  region_.swap(other.region_);
  bip::mapped_region().swap(other.region_);  // unmaps what this object held before
  name_ = std::move(other.name_);
  path_ = std::move(other.path_);
  payloadBytes_ = std::exchange(other.payloadBytes_, 0);
  generation_ = std::exchange(other.generation_, 0);
  device_ = std::exchange(other.device_, 0);
  inode_ = std::exchange(other.inode_, 0);
  isCreator_ = std::exchange(other.isCreator_, false);
  unlinkOnDestroy_ = std::exchange(other.unlinkOnDestroy_, false);
  return *this;
}

ShmRegion::~ShmRegion() {
  if (unlinkOnDestroy_ && nameStillRefersToUs()) ::unlink(path_.c_str());
}

void ShmRegion::publish() {
  COHORT_CHECK(isCreator_) << "only the creator publishes " << name_;
  header()->ready.store(1, std::memory_order_release);
}

bool ShmRegion::isPublished() const {
  return region_.get_address() != nullptr && header()->ready.load(std::memory_order_acquire) == 1;
}

bool ShmRegion::nameStillRefersToUs() const {
  struct stat st {};
  return !path_.empty() && stat(path_.c_str(), &st) == 0 && st.st_dev == device_ && st.st_ino == inode_;
}

void ShmRegion::unlink() {
  if (!nameStillRefersToUs()) return;
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) {
    COHORT_THROW(IoError) << "cannot remove shared-memory segment " << path_ << ": " << std::strerror(errno);
  }
}

}  // namespace cohort::ipc
