// ShmRegion: one named shared-memory segment of a job, mapped into this process (RAII).
//
// A segment is the file segmentPath(jobId, name) (ipc/shm_names.h: in this user's private 0700
// directory <shmDirectory()>/cohort-<euid>, ipc/private_dir.h), mode 0600, mapped with Boost.Interprocess (file_mapping + mapped_region). It starts with a
// SegmentHeader (segment_header.h: magic, layout version, payload size, generation, creator pid and
// start time, `ready` flag); the payload follows at offset 4096, so it is 4096-byte aligned.
//
// Order of calls across processes:
//   creator (one process, e.g. local rank 0)      openers (every other process)
//   r = ShmRegion::create(opts)                   r = ShmRegion::open(opts)   // polls, with timeout
//   initialise r.payload()                          ... blocks until the creator has published ...
//   r.publish()          ------------------------>  returns; r.payload() is initialised and visible
// create() reserves every page up front (fallocate): a /dev/shm that is too small fails there with
// an IoError naming the segment, the bytes needed and the bytes available — never a SIGBUS later.
// A segment left by a dead creator or an older generation is replaced; one of a live creator of the
// same or a newer generation is an InvalidArgument. A file this user's jobs did not make (another
// owner's, a symlink, not a regular file) is an InvalidArgument at once, naming it and its owner,
// in create() and open() alike. open() validates every header field: a foreign or corrupt file is
// an IoError; a creator that dies before publishing is a PeerError; no segment
// in time is a TimeoutError that says what was missing.
//
// Ownership: the ShmRegion owns its mapping (unmapped by the destructor). The name outlives it unless
// unlink() is called or CreateOptions::unlinkOnDestroy is set: other processes may still be attached,
// and the launcher removes a job's segments at its end (removeJobSegments). Unlinking never disturbs
// processes that have it mapped.
// Thread safety: the object is immutable after create()/open() except publish() and unlink(); the
// payload is raw shared memory, synchronise access to it yourself (atomics, ProcessBarrier).
//
//   auto r = ShmRegion::create({.jobId = world.jobId, .name = "params", .payloadBytes = n * 4});
//   std::fill_n(static_cast<float*>(r.payload()), n, 0.f);
//   r.publish();
#pragma once

#include <sys/types.h>

#include <boost/interprocess/mapped_region.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ipc/segment_header.h"

namespace cohort::ipc {

class ShmRegion {
 public:
  struct CreateOptions {
    std::string jobId;
    std::string name;         // [A-Za-z0-9_-]+; the file is segmentName(jobId, name)
    size_t payloadBytes = 0;  // bytes after the header
    uint64_t generation = 0;  // bumped by a restarted job, so stale segments are told apart
    bool unlinkOnDestroy = false;
  };

  struct OpenOptions {
    std::string jobId;
    std::string name;
    size_t payloadBytes = 0;  // must equal the creator's
    uint64_t generation = 0;  // an older segment is waited past; a newer one is an error
    std::chrono::milliseconds timeout{std::chrono::seconds(60)};
    // Who is expected to create the segment, for the timeout message.
    std::string creatorDescription = "local rank 0 (the creator)";
  };

  // Creates, sizes (ftruncate + fallocate) and maps the segment; it is not yet ready.
  // Throws InvalidArgument (a live segment of that name exists), IoError (not enough shared memory,
  // or the file system refused).
  static ShmRegion create(const CreateOptions& options);
  // Waits until the segment exists, is fully sized, matches and is published, then maps it.
  // Throws TimeoutError, PeerError (its creator died before publishing) or IoError (corrupt file).
  static ShmRegion open(const OpenOptions& options);

  ShmRegion(ShmRegion&& other) noexcept;
  ShmRegion& operator=(ShmRegion&& other) noexcept;
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;
  ~ShmRegion();

  void* payload() const { return static_cast<char*>(region_.get_address()) + kSegmentHeaderBytes; }
  size_t payloadBytes() const { return payloadBytes_; }
  uint64_t generation() const { return generation_; }
  const std::string& name() const { return name_; }  // "cohort.<jobId>.<name>"
  const std::string& path() const { return path_; }  // directory + "/" + name()
  bool isCreator() const { return isCreator_; }
  // The creator's pid and start time (/proc/<pid>/stat field 22; 0 when unknown), from the header:
  // with processIsAlive() they tell whether the creator still runs.
  pid_t creatorPid() const { return header()->creatorPid; }
  uint64_t creatorStartTicks() const { return header()->creatorStartTicks; }

  // Creator only: marks the payload initialised (release order; openers acquire it).
  void publish();
  bool isPublished() const;

  // Removes the name if it still refers to this segment (not a replacement of a newer generation);
  // the mapping stays valid. Idempotent; throws IoError when the file system refuses.
  void unlink();

 private:
  ShmRegion() = default;
  SegmentHeader* header() const { return static_cast<SegmentHeader*>(region_.get_address()); }
  void map(size_t totalBytes);
  bool nameStillRefersToUs() const;

  boost::interprocess::mapped_region region_;
  std::string name_;
  std::string path_;
  size_t payloadBytes_ = 0;
  uint64_t generation_ = 0;
  dev_t device_ = 0;  // identity of the file, so unlink() never removes a successor
  ino_t inode_ = 0;
  bool isCreator_ = false;
  bool unlinkOnDestroy_ = false;
};

}  // namespace cohort::ipc
