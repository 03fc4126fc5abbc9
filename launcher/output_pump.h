// OutputPump: turns the bytes the workers write on their stdout/stderr pipes into whole lines on
// cohortrun's own stdout/stderr, each prefixed "[rank k] ", and (with a log directory) into one file
// per rank, DIR/rank<k>.log, unprefixed, both streams.
//
// Lines: every complete line is written with one write() call, so lines of different ranks never
// interleave mid-line. A partial line waits for its newline, or for flushPartial() at end of file
// (it is then ended with a newline). A line longer than maxLineBytes is written in pieces of that
// size, each as a line of its own, so one runaway writer cannot make the launcher buffer without
// bound. Log files are opened for appending: restarts (and later runs) add to them, after a
// separator line naming the job and the attempt. The last tailLines lines of each rank (both
// streams, in arrival order) are kept for failure reports.
// Ownership: the pump owns its log files; it never owns the pipes it reads. Thread safety: none (the
// supervisor's poll loop is its only user).
//
//   OutputPump pump({.worldSize = 2, .logDir = "logs", .jobId = plan.jobId});
//   pump.beginAttempt(0);
//   if (!pump.drain(fd, rank, StreamKind::kStdout)) { pump.flushPartial(rank, StreamKind::kStdout); … }
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/unique_fd.h"

namespace cohort::launcher {

enum class StreamKind { kStdout = 0, kStderr = 1 };

struct OutputPumpOptions {
  int worldSize = 1;
  std::string logDir;  // empty: no log files; else created if missing
  std::string jobId;   // named in the log separators
  int stdoutFd = 1;
  int stderrFd = 2;
  size_t tailLines = 20;
  size_t maxLineBytes = 16384;
};

class OutputPump {
 public:
  // Creates the log directory and opens the log files; throws IoError (naming the path) on failure.
  explicit OutputPump(const OutputPumpOptions& options);
  OutputPump(const OutputPump&) = delete;
  OutputPump& operator=(const OutputPump&) = delete;

  // Starts a new attempt: drops any partial line left from the last one and writes a separator line
  // into every log file.
  void beginAttempt(int restartCount);

  // Reads what is available now (up to 1 MiB) on the non-blocking descriptor `fd`, which carries
  // `stream` of `rank`, and writes the complete lines. Returns false at end of file (or a read error).
  bool drain(int fd, int rank, StreamKind stream);

  // Writes the partial line of that stream, if any, ended with a newline.
  void flushPartial(int rank, StreamKind stream);

  // The last lines of `rank` (oldest first).
  const std::deque<std::string>& tail(int rank) const { return ranks_.at(rank).tail; }

 private:
  struct RankState {
    std::string partial[2];  // by StreamKind
    std::deque<std::string> tail;
    runtime::UniqueFd logFile;
  };

  void consume(int rank, StreamKind stream, std::string_view bytes);
  void emitLine(int rank, StreamKind stream, std::string_view line);

  OutputPumpOptions options_;
  std::vector<RankState> ranks_;
};

// Writes all of `text` to `fd`, retrying short writes and EINTR. Errors (a closed terminal, EPIPE)
// are ignored: losing output must not take the job down.
void writeAll(int fd, std::string_view text);

}  // namespace cohort::launcher
