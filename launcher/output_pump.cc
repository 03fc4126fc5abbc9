#include "launcher/output_pump.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "runtime/error.h"
#include "runtime/user_name.h"

namespace cohort::launcher {
namespace {

// To column 0 and erase to the end of the row: removes the status line.
constexpr std::string_view kEraseLine = "\r\x1b[K";

std::string localTimeNow() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %z", &tm);
  return buf;
}

// Opens DIR/rank<k>.log for appending, only as a regular file of this user: never through a
// symbolic link, never a FIFO (the open does not block), never another user's file. A log directory
// in a place others can write (/tmp/logs) could otherwise hold a link that another user planted,
// and cohortrun would append a worker's output to whatever it points at (docs/security.md).
runtime::UniqueFd openLogFile(const std::string& path) {
  runtime::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644));
  if (!fd) {
    const int err = errno;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      COHORT_THROW(IoError) << "--log-dir: " << path << " is a symbolic link (owned by "
                            << runtime::describeUser(st.st_uid) << "): log files are never written through one; "
                            << "remove it, or give --log-dir a directory of your own";
    }
    // A FIFO without a reader fails the non-blocking open (ENXIO) instead of blocking it.
    if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      COHORT_THROW(IoError) << "--log-dir: " << path << " is not a regular file: remove it, or give --log-dir another directory";
    }
    COHORT_THROW(IoError) << "--log-dir: cannot open log file " << path << ": " << std::strerror(err);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) COHORT_THROW(IoError) << "--log-dir: cannot stat " << path << ": " << std::strerror(errno);
  if (!S_ISREG(st.st_mode)) {
    COHORT_THROW(IoError) << "--log-dir: " << path << " is not a regular file: remove it, or give --log-dir another directory";
  }
  if (st.st_uid != ::geteuid()) {
    COHORT_THROW(IoError) << "--log-dir: " << path << " is owned by " << runtime::describeUser(st.st_uid)
                          << ", not you: refusing to append a worker's output to it; give --log-dir a directory of your own";
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    COHORT_THROW(IoError) << "--log-dir: cannot set blocking writes on " << path << ": " << std::strerror(errno);
  }
  return fd;
}

}  // namespace

void writeAll(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<size_t>(n));
  }
}

OutputPump::OutputPump(const OutputPumpOptions& options) : options_(options), ranks_(options.worldSize) {
  if (options_.logDir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(options_.logDir, ec);
  if (ec) COHORT_THROW(IoError) << "cannot create log directory " << options_.logDir << ": " << ec.message();
  for (int rank = 0; rank < options_.worldSize; ++rank) {
    const std::string path = options_.logDir + "/rank" + std::to_string(rank) + ".log";
    ranks_[rank].logFile = openLogFile(path);
  }
}

OutputPump::~OutputPump() { clearStatus(); }

void OutputPump::beginAttempt(int restartCount) {
  clearStatus();
  const std::string separator =
      "===== cohortrun: job " + options_.jobId + ", attempt " + std::to_string(restartCount + 1) +
      " (COHORT_RESTART_COUNT=" + std::to_string(restartCount) + "), started " + localTimeNow() + " =====\n";
  for (RankState& state : ranks_) {
    state.partial[0].clear();
    state.partial[1].clear();
    if (state.logFile) writeAll(state.logFile.get(), separator);
  }
}

bool OutputPump::drain(int fd, int rank, StreamKind stream) {
  // At most 1 MiB per call, so one worker that never stops writing cannot starve the others or
  // the signal handling; poll() reports the rest.
  constexpr int kMaxReads = 16;
  char buf[65536];
  for (int reads = 0; reads < kMaxReads;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      consume(rank, stream, std::string_view(buf, static_cast<size_t>(n)));
      ++reads;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    return false;  // end of file, or an error that makes the pipe useless
  }
  return true;
}

void OutputPump::flushPartial(int rank, StreamKind stream) {
  std::string& partial = ranks_.at(rank).partial[static_cast<int>(stream)];
  if (partial.empty()) return;
  std::string line = std::move(partial);
  partial.clear();
  emitLine(rank, stream, line);
}

void OutputPump::endOfStream(int rank, StreamKind stream) {
  flushPartial(rank, stream);
  if (rank == 0 && stream == StreamKind::kStdout) clearStatus();
}

void OutputPump::clearStatus() {
  if (status_.empty()) return;
  writeAll(options_.stdoutFd, kEraseLine);
  status_.clear();
}

void OutputPump::writeOwn(std::string_view text) { writeAround(options_.stderrFd, text); }

void OutputPump::consume(int rank, StreamKind stream, std::string_view bytes) {
  std::string& partial = ranks_.at(rank).partial[static_cast<int>(stream)];
  while (!bytes.empty()) {
    size_t newline = bytes.find('\n');
    size_t take = newline == std::string_view::npos ? bytes.size() : newline;
    // Never hold more than maxLineBytes of one line: emit a full piece as a line of its own.
    size_t room = options_.maxLineBytes - partial.size();
    if (take > room) {
      partial.append(bytes.substr(0, room));
      bytes.remove_prefix(room);
      flushPartial(rank, stream);
      continue;
    }
    partial.append(bytes.substr(0, take));
    if (newline == std::string_view::npos) return;
    bytes.remove_prefix(take + 1);
    std::string line = std::move(partial);
    partial.clear();
    emitLine(rank, stream, line);
  }
}

void OutputPump::emitLine(int rank, StreamKind stream, std::string_view line) {
  if (line.substr(0, kProgressMarker.size()) == kProgressMarker) {
    progressLine(rank, stream, line.substr(kProgressMarker.size()));
    return;
  }
  RankState& state = ranks_.at(rank);
  std::string text = "[rank " + std::to_string(rank) + "] ";
  const size_t prefixSize = text.size();
  text.append(line);
  text.push_back('\n');
  writeAround(stream == StreamKind::kStdout ? options_.stdoutFd : options_.stderrFd, text);
  if (state.logFile) writeAll(state.logFile.get(), std::string_view(text).substr(prefixSize));
  state.tail.emplace_back(line);
  while (state.tail.size() > options_.tailLines) state.tail.pop_front();
}

void OutputPump::progressLine(int rank, StreamKind stream, std::string_view text) {
  // Only rank 0 reports progress (train/observe/progress.h); one status line cannot show several ranks'.
  if (!options_.liveStatus || rank != 0 || stream != StreamKind::kStdout) return;
  if (text.empty()) {  // the marker alone: the epoch ended
    clearStatus();
    return;
  }
  status_ = "[rank 0] ";
  status_.append(text);
  writeAll(options_.stdoutFd, statusBytes());
}

void OutputPump::writeAround(int fd, std::string_view text) {
  if (status_.empty()) {
    writeAll(fd, text);
    return;
  }
  if (fd == options_.stdoutFd) {
    // One write: another process writing to the same terminal sees the line whole.
    std::string bytes(kEraseLine);
    bytes.append(text);
    bytes.append(statusBytes());
    writeAll(fd, bytes);
    return;
  }
  writeAll(options_.stdoutFd, kEraseLine);
  writeAll(fd, text);
  writeAll(options_.stdoutFd, statusBytes());
}

std::string OutputPump::statusBytes() const {
  // Never as wide as the terminal: a wrapped line (or a cursor past the last column) could not be
  // erased and redrawn from its start with "\r". The width is read at each draw: windows resize.
  std::string_view status = status_;
  winsize size{};
  if (::ioctl(options_.stdoutFd, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) {
    status = status.substr(0, static_cast<size_t>(size.ws_col) - 1);
  }
  std::string bytes = "\r";
  bytes.append(status);
  bytes.append("\x1b[K");
  return bytes;
}

}  // namespace cohort::launcher
