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
//
// Status line (liveStatus: cohortrun's own stdout is a terminal, so it set COHORT_PROGRESS=live for
// the workers, train/observe/progress.h): a line of rank 0's stdout that starts with kProgressMarker is not
// a line of output but rank 0's live progress. It is shown as one status line at the bottom of the
// terminal, "\r[rank 0] TEXT\x1b[K" with no newline, cut to the terminal's width; the marker alone
// clears it. Every other line is written around it: "\r\x1b[K" (erase the status line), the line,
// the status line again — in one write() for a stdout line, so lines stay whole; a stderr line goes
// to stderr between an erase and a redraw on stdout. cohortrun's own messages go through
// writeOwn() for the same reason. Marker lines never reach a log file, the tail, or a stdout that is
// not a terminal; those of other ranks, or on stderr, are dropped (only rank 0 reports progress).
// endOfStream() of rank 0's stdout and clearStatus() (the attempt's end) erase the status line.
// Ownership: the pump owns its log files; it never owns the pipes it reads. Thread safety: none (the
// supervisor's poll loop is its only user).
//
//   OutputPump pump({.worldSize = 2, .logDir = "logs", .jobId = plan.jobId});
//   pump.beginAttempt(0);
//   if (!pump.drain(fd, rank, StreamKind::kStdout)) { pump.endOfStream(rank, StreamKind::kStdout); … }
//   pump.clearStatus();
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/unique_fd.h"

namespace cohort::launcher {

enum class StreamKind { kStdout = 0, kStderr = 1 };

// Starts a progress line of a worker (train::kProgressMarker, train/observe/progress.h: the launcher may not
// include train/, so the bytes are repeated here; tests/launcher/output_pump_test checks they agree).
inline constexpr std::string_view kProgressMarker = "\x1b_cohort-progress\x1b\\";

struct OutputPumpOptions {
  int worldSize = 1;
  std::string logDir;  // empty: no log files; else created if missing
  std::string jobId;   // named in the log separators
  int stdoutFd = 1;
  int stderrFd = 2;
  size_t tailLines = 20;
  size_t maxLineBytes = 16384;
  bool liveStatus = false;  // stdoutFd is a terminal: show rank 0's progress as a status line
};

class OutputPump {
 public:
  // Creates the log directory and opens the log files; throws IoError (naming the path) on failure.
  explicit OutputPump(const OutputPumpOptions& options);
  OutputPump(const OutputPump&) = delete;
  OutputPump& operator=(const OutputPump&) = delete;
  ~OutputPump();  // erases a status line still showing (an error message may follow)

  // Starts a new attempt: drops any partial line left from the last one and writes a separator line
  // into every log file.
  void beginAttempt(int restartCount);

  // Reads what is available now (up to 1 MiB) on the non-blocking descriptor `fd`, which carries
  // `stream` of `rank`, and writes the complete lines. Returns false at end of file (or a read error).
  bool drain(int fd, int rank, StreamKind stream);

  // Writes the partial line of that stream, if any, ended with a newline.
  void flushPartial(int rank, StreamKind stream);

  // The stream reached its end (the worker closed it or died): flushPartial(), and for rank 0's
  // stdout clearStatus(), since no more progress can come.
  void endOfStream(int rank, StreamKind stream);

  // Erases the status line, if one shows, and forgets it (the end of an attempt).
  void clearStatus();

  // Writes cohortrun's own `text` (whole lines) to stderr with one write(), around the status line.
  void writeOwn(std::string_view text);

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
  // A marker line of `rank` on `stream`: `text` is what follows the marker.
  void progressLine(int rank, StreamKind stream, std::string_view text);
  // Writes `text` to `fd`, erasing the status line before and drawing it again after.
  void writeAround(int fd, std::string_view text);
  // "\r[rank 0] TEXT\x1b[K", TEXT cut so that the line never wraps.
  std::string statusBytes() const;

  OutputPumpOptions options_;
  std::vector<RankState> ranks_;
  std::string status_;  // "[rank 0] TEXT" while a status line shows, else empty
};

// Writes all of `text` to `fd`, retrying short writes and EINTR. Errors (a closed terminal, EPIPE)
// are ignored: losing output must not take the job down.
void writeAll(int fd, std::string_view text);

}  // namespace cohort::launcher
