// RankRoster: the list of one job's processes on this node, one slot per local rank, so that every
// rank knows from the start which processes its peers are, and whether each is still alive, has
// finished, or left early (issue 33). It is the file segmentPath(jobId, "roster"), in this user's
// private shared-memory directory (ipc/private_dir.h); a file there that this user did not make is
// refused at once (InvalidArgument naming it and its owner).
//
// Why it exists: a ProcessBarrier or a segment learns a peer's pid only when that peer arrives, so a
// rank that died (or exited 0) before its first barrier used to be noticed only by the deadline.
// The roster knows a rank's pid earlier: cohortrun records every worker's pid right after it starts
// it (recordStarted), and a worker records its own when its train::Job is made (join). The process
// that joins may be the one cohortrun started or a descendant of it (a wrapper script's child);
// it then takes the slot over, and its peers watch it from then on.
//
// Slot states: empty; started (the launcher recorded the pid); joined (the process made its Job);
// finished (it ended its Job normally); abandoned (an error unwound its Job). A peer that abandoned
// the job, or whose process is gone while its slot is not finished, left the job early:
// arriveAndWait() names it at once (PeerError) instead of waiting for it, and cohortrun counts a
// worker that exits 0 that way as a failure.
//
// Claims (join): a rank is refused (InvalidArgument) while another live process holds its slot. The
// roster sees a second job of the same id only while its name exists (see Lifetime); what refuses
// such a job for the whole run is train::Job's RankClaim (ipc/rank_claim.h). A roster whose
// processes (and launcher) are all gone or left is stale, left by a crash or an earlier job: the next
// join removes it with every segment of that job id on the node and starts afresh, so a job id can be
// reused after a crash.
// Concurrency: the file is created by whichever process comes first; claims, finishing and the
// staleness decision happen under flock() on it (held for microseconds, released by the kernel when
// a holder dies); slots are lock-free atomics that peers read without the lock, and a verdict that a
// peer left is confirmed under the lock.
// Lifetime: as with every segment of a job, the name is removed once every local rank has joined
// (the mappings stay valid), so workers killed all at once (mpirun or srun ending a job) leave
// nothing in shared memory. Until then the last member to leave removes it: the launcher at the end of
// its attempt, or where there is none the last worker (the one that finds every other worker gone or
// left), which removes every segment name of the job on the node with it (removeJobSegments). A
// roster left by a crash before every rank joined is removed by cohortrun's sweep or by the next job
// of that id.
// Ownership: a RankRoster owns its descriptor and mapping (move-only).
// Thread safety: one thread per process uses a RankRoster; different processes use it at once.
//
//   ipc::RankRoster roster = ipc::RankRoster::join({.jobId = w.jobId, .rank = w.rank,
//                                                   .localRank = w.localRank, .localWorldSize = w.localWorldSize});
//   roster.arriveAndWait("agreement 'settings-0'", timeout);   // every local rank, same order
//   roster.leave(true);                                           // at the Job's normal end
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/unique_fd.h"

namespace cohort::ipc {

// kAbandoned: the process left without finishing (its Job was unwound by an error).
enum class RosterState : uint32_t { kEmpty = 0, kStarted = 1, kJoined = 2, kFinished = 3, kAbandoned = 4 };

struct RosterEntry {
  int localRank = 0;
  int rank = -1;  // the world rank; -1 until known
  pid_t pid = 0;
  RosterState state = RosterState::kEmpty;
};

class RankRoster {
 public:
  struct JoinOptions {
    std::string jobId;
    int rank = 0;
    int localRank = 0;
    int localWorldSize = 1;
    // Where the job id came from, for the refusal ("COHORT_JOB_ID=x"); empty: "job id x".
    std::string jobIdSource;
    std::chrono::milliseconds lockTimeout{std::chrono::seconds(10)};
  };

  // The launcher, before it starts the workers: a fresh roster naming the calling process as the
  // job's launcher (a roster with a live launcher is never stale). IoError when the file cannot be
  // made.
  static RankRoster createForLauncher(const std::string& jobId, int localWorldSize);
  // The launcher: `pid` (its child) is local rank `localRank` (also its world rank: one node).
  void recordStarted(int localRank, pid_t pid);

  // A worker claims its slot. InvalidArgument when a live process holds it (naming that process,
  // its host and the job id), or when the live job of that id has another number of local ranks.
  static RankRoster join(const JoinOptions& options);
  // The worker leaves: finished (its Job ended normally) or abandoned. The last member to leave
  // (no launcher) removes the names of the job's segments on the node, the roster's included.
  // Never throws (destructors call it).
  void leave(bool finished) noexcept;

  // Collective over the local ranks: every rank calls it the same number of times. Returns once
  // every local rank has arrived. Every ~20 ms it looks at the ranks still missing: one whose
  // process is gone, or that left, is a PeerError ("rank 1 (pid P on H) exited before the job
  // finished, while rank 0 waited at <what>"; "failed before ..."; "finished and left the job
  // ..."); past `timeout` a TimeoutError lists the missing ranks.
  void arriveAndWait(const std::string& what, std::chrono::milliseconds timeout);

  std::vector<RosterEntry> entries() const;
  RosterState stateOf(int localRank) const;
  // Whether any process has joined: the workers use the Cohort runtime (cohortrun's test).
  bool anyJoined() const;
  // Whether every local rank has joined (and so the name is gone: join() removes it then).
  bool everyRankJoined() const;
  // Removes the name if it still refers to this roster (the launcher, at an attempt's end).
  void unlink() noexcept;
  // The slots of job `jobId`'s roster on this node as they are now; empty when it has none. For
  // tests and diagnostics: takes no lock and changes nothing.
  static std::vector<RosterEntry> peek(const std::string& jobId);
  // For the stale-segment sweep: removes `path` and returns true when it is a roster that no live
  // process (nor its launcher) belongs to and that nobody holds locked right now.
  static bool removeIfStale(const std::string& path);
  const std::string& path() const { return path_; }

  RankRoster(RankRoster&& other) noexcept;
  RankRoster& operator=(RankRoster&& other) noexcept;
  RankRoster(const RankRoster&) = delete;
  RankRoster& operator=(const RankRoster&) = delete;
  ~RankRoster();

 private:
  struct Header;
  struct Slot;
  class Lock;
  RankRoster() = default;

  static std::optional<RankRoster> openExisting(const std::string& path);  // a laid-out roster, unlocked
  static RankRoster openLocked(const std::string& jobId, std::chrono::milliseconds lockTimeout, Lock& lock);
  bool prepare(int localWorldSize, const JoinOptions* joiner);
  bool isLeftover();
  void claim(const JoinOptions& options);
  bool mayTakeOver(const Slot& s) const;
  Slot& slot(int localRank) const;
  // A local rank whose process lives and has not left, kLauncher (alive), or -1.
  int liveMemberOtherThan(pid_t self) const;
  std::string describeMember(int member) const;
  bool allArrived(uint64_t arrival) const;
  const char* leftWithoutArriving(const Slot& s, uint64_t arrival) const;
  void checkMissing(uint64_t arrival, const std::string& what) const;
  [[noreturn]] void throwTimeout(uint64_t arrival, const std::string& what, std::chrono::milliseconds timeout) const;
  void map(size_t bytes);
  void unmap() noexcept;

  static constexpr int kLauncher = -2;
  static constexpr uint64_t kMaxLocalRanks = 1 << 20;
  static size_t bytesFor(uint64_t localWorldSize);
  bool holdsRoster() const;  // the mapping holds a laid-out roster

  runtime::UniqueFd fd_;
  void* memory_ = nullptr;
  size_t bytes_ = 0;
  std::string jobId_;
  std::string path_;
  std::string host_;
  int localRank_ = -1;  // the caller's slot; -1 for the launcher
};

}  // namespace cohort::ipc
