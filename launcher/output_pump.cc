#include "launcher/output_pump.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <system_error>

#include "runtime/error.h"

namespace cohort::launcher {
namespace {

std::string localTimeNow() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S %z", &tm);
  return buf;
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
    ranks_[rank].logFile = runtime::UniqueFd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (!ranks_[rank].logFile) COHORT_THROW(IoError) << "cannot open log file " << path << ": " << std::strerror(errno);
  }
}

void OutputPump::beginAttempt(int restartCount) {
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
  RankState& state = ranks_.at(rank);
  std::string text = "[rank " + std::to_string(rank) + "] ";
  const size_t prefixSize = text.size();
  text.append(line);
  text.push_back('\n');
  writeAll(stream == StreamKind::kStdout ? options_.stdoutFd : options_.stderrFd, text);
  if (state.logFile) writeAll(state.logFile.get(), std::string_view(text).substr(prefixSize));
  state.tail.emplace_back(line);
  while (state.tail.size() > options_.tailLines) state.tail.pop_front();
}

}  // namespace cohort::launcher
