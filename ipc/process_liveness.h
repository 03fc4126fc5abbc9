// Whether a process still exists, robust to pid reuse.
//
// A pid alone is not an identity: after a process exits, the kernel may hand its pid to a new one.
// The pair (pid, start time in clock ticks since boot, /proc/<pid>/stat field 22) is. Segment headers
// and cohortrun job ids record both, so a stale segment is recognised even when its pid was reused.
// Thread safety: stateless; safe from any thread. Linux only (/proc).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace cohort::ipc {

// The fields of /proc/<pid>/stat that liveness (and ancestry) needs.
struct ProcStat {
  char state = '?';         // field 3: R, S, D, Z (zombie), X (dead), ...
  pid_t parent = 0;         // field 4: the parent's pid
  pid_t group = 0;          // field 5: the process group
  uint64_t startTicks = 0;  // field 22: start time in clock ticks since boot
};

// Parses the text of a /proc/<pid>/stat file; nullopt when malformed. The comm field (2) may contain
// spaces and parentheses, so fields are counted after the last ')'.
std::optional<ProcStat> parseProcStat(const std::string& statText);

// /proc/<pid>/stat of a process, or nullopt when it does not exist (or the file cannot be parsed).
std::optional<ProcStat> readProcStat(pid_t pid);

// Field 22 of /proc/<pid>/stat, or nullopt when the process does not exist.
std::optional<uint64_t> processStartTicks(pid_t pid);

// False when no process with `pid` exists, it is a zombie (exited, not yet reaped), or it exists with
// another start time (pid reused). startTicks == 0 means "unknown": the start time is not compared.
bool processIsAlive(pid_t pid, uint64_t startTicks);

// Whether process group `group` has a member that has not exited (zombies, which wait only for
// their reaping, do not count; a process whose main thread has exited while other threads of it
// still run does: they still hold its files).
bool groupHasLiveMember(pid_t group);

// This machine's host name, for messages ("unknown host" when it cannot be read).
std::string thisHost();

// Whether `ancestor` is the calling process's parent, grandparent, ... (up to 64 generations).
bool isAncestorOfThisProcess(pid_t ancestor);

}  // namespace cohort::ipc
