// Names and lifetime of a job's shared-memory segments.
//
// Every segment of a job lives in this user's private directory inside the shared-memory directory
// (shmDirectory(): /dev/shm, or $COHORT_SHM_DIR when set, e.g. a small tmpfs in tests), made and
// verified by ipc/private_dir.h, under the name
//   <shmDirectory()>/cohort-<euid>/cohort.<jobId>.<name>
// so one job's segments are found, and removed, by the prefix "cohort.<jobId>.", and no other user
// can create, replace or remove any of them. Job ids contain only [A-Za-z0-9_-] (sanitizeJobId()
// maps anything else to '_'). The job's rank claims (ipc/rank_claim.h) are sockets in the same
// directory; the functions below that remove names remove a claim only when nobody holds it.
//
// cohortrun makes job ids "cr-<pid>-<start>-<pidns>" from its own pid, process start time (in clock
// ticks, /proc/<pid>/stat field 22) and pid namespace (the inode of /proc/self/ns/pid), so a segment
// whose launcher is gone is recognisable: no process with that pid, or one with another start time
// (pid reuse). Jobs of another pid namespace (a container or sandbox sharing /dev/shm) are never
// judged from this one. sweepStaleSegments() removes exactly those,
// plus segments of other jobs whose header names a creator pid that no longer exists and that are
// older than a grace period. It never touches a live job's segments.
// Thread safety: all functions are safe to call concurrently (they only use the file system).
#pragma once

#include <string>
#include <sys/types.h>
#include <vector>

namespace cohort::ipc {

// "/dev/shm" or $COHORT_SHM_DIR.
std::string shmDirectory();

std::string sanitizeJobId(const std::string& jobId);
// "cohort.<jobId>.<name>" (jobId sanitized; name must be [A-Za-z0-9_-]+, else InvalidArgument).
std::string segmentName(const std::string& jobId, const std::string& name);
// "cohort.<jobId>."
std::string jobPrefix(const std::string& jobId);
// "<private directory>/cohort.<jobId>.<name>", after making and verifying the private directory
// (InvalidArgument when another user owns it: ipc/private_dir.h).
std::string segmentPath(const std::string& jobId, const std::string& name);

// cohortrun's job id for the calling process: "cr-<pid>-<start ticks>-<pid namespace inode>".
std::string makeLauncherJobId();
// True when jobId has cohortrun's form and its launcher process no longer exists.
bool launcherJobIsGone(const std::string& jobId);

// Removes every segment of `jobId` (and its claims that nobody holds); returns the names removed.
// Missing segments are not an error.
std::vector<std::string> removeJobSegments(const std::string& jobId);
// Removes the segments of `jobId` whose creator is gone (by the creator recorded in the segment's
// header; a file without one is kept); returns the names removed. For the first process of a job on
// a node (RankRoster::join), before any rank of it made a segment: what it finds was left by a
// crashed job of the same id, and a rank must not open it.
std::vector<std::string> removeOrphanedSegments(const std::string& jobId);
// Removes the segments of jobs whose launcher (or creator) is gone, and every claim nobody holds;
// returns the names removed. Removes nothing when the private directory is not ours.
std::vector<std::string> sweepStaleSegments();

}  // namespace cohort::ipc
