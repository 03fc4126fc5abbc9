#include "train/observe/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace cohort::train {
namespace {

// Redraws a second at most: enough to look live, few enough that a terminal (or cohortrun, which
// redraws its status line after every other line) never becomes the bottleneck.
constexpr double kTerminalInterval = 0.1;
constexpr double kLauncherInterval = 0.25;
constexpr double kNever = -std::numeric_limits<double>::infinity();  // "due at once"

constexpr std::string_view kEraseLine = "\r\x1b[K";  // to column 0, erase to the end of the row

double steadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Appends printf-formatted text at buf[len], never past cap (the text is cut instead).
void appendf(char* buf, size_t cap, size_t& len, const char* format, ...) __attribute__((format(printf, 4, 5)));
void appendf(char* buf, size_t cap, size_t& len, const char* format, ...) {
  if (len + 1 >= cap) return;
  va_list args;
  va_start(args, format);
  const int n = std::vsnprintf(buf + len, cap - len, format, args);
  va_end(args);
  if (n > 0) len = std::min(len + static_cast<size_t>(n), cap - 1);
}

// "M:SS", or "H:MM:SS" from an hour on; whole seconds, rounded.
void appendDuration(char* buf, size_t cap, size_t& len, double seconds) {
  // Clamped so that a nonsensical estimate (a clock jump, a step count past the total) stays printable.
  const long long s = std::llround(std::clamp(seconds, 0.0, 1e9));
  if (s >= 3600) {
    appendf(buf, cap, len, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  } else {
    appendf(buf, cap, len, "%lld:%02lld", s / 60, s % 60);
  }
}

// Copies `bytes` to buf[len], as much as fits.
void appendBytes(char* buf, size_t cap, size_t& len, std::string_view bytes) {
  if (len >= cap) return;
  const size_t n = std::min(bytes.size(), cap - len);
  std::memcpy(buf + len, bytes.data(), n);
  len += n;
}

}  // namespace

const char* toString(ProgressMode mode) {
  switch (mode) {
    case ProgressMode::kOff:
      return "off";
    case ProgressMode::kTerminal:
      return "terminal";
    case ProgressMode::kLauncher:
      return "launcher";
    case ProgressMode::kPlain:
      return "plain";
  }
  return "?";
}

ProgressMode detectProgressMode(double everySeconds, int fd) {
  if (!(everySeconds > 0)) return ProgressMode::kOff;
  // cohortrun sets "live" only when its own stdout is a terminal; users set "plain" or "off" to
  // override what the terminal test below would choose.
  if (const char* env = std::getenv("COHORT_PROGRESS")) {
    if (std::strcmp(env, "live") == 0) return ProgressMode::kLauncher;
    if (std::strcmp(env, "plain") == 0) return ProgressMode::kPlain;
    if (std::strcmp(env, "off") == 0) return ProgressMode::kOff;
  }
  // Open MPI hands its ranks a pseudo-terminal for stdout whatever mpirun's own output is (a file,
  // a pipe, several ranks merged): not a terminal a line can be rewritten on.
  const bool openMpiPty = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  if (::isatty(fd) == 1 && !openMpiPty) {
    // A dumb terminal (Emacs' shell, some CI consoles) has no "erase to end of line".
    const char* term = std::getenv("TERM");
    if (term == nullptr || std::strcmp(term, "dumb") != 0) return ProgressMode::kTerminal;
  }
  return ProgressMode::kPlain;
}

Progress::Progress(const ProgressOptions& options) : options_(options) {
  if (!options_.clock) options_.clock = steadySeconds;
  switch (options_.mode) {
    case ProgressMode::kTerminal:
      interval_ = kTerminalInterval;
      break;
    case ProgressMode::kLauncher:
      interval_ = kLauncherInterval;
      break;
    case ProgressMode::kPlain:
      // A non-positive interval would print at every step; such a caller means "off".
      if (!(options_.everySeconds > 0)) options_.mode = ProgressMode::kOff;
      interval_ = options_.everySeconds;
      break;
    case ProgressMode::kOff:
      break;
  }
  nextDue_ = kNever;
  text_[0] = '\0';
}

Progress::~Progress() { endEpoch(); }

void Progress::startEpoch(int64_t epoch, int64_t stepInEpoch) {
  epoch_ = epoch;
  firstStep_ = stepInEpoch_ = stepInEpoch;
  samples_ = 0;
  lossSum_ = 0;
  lossSamples_ = 0;
  if (options_.mode == ProgressMode::kOff) return;
  epochStart_ = options_.clock();
  if (options_.mode == ProgressMode::kPlain) {
    if (!scheduled_) nextDue_ = epochStart_ + interval_;
    scheduled_ = true;
  } else {
    nextDue_ = kNever;  // the epoch's first step shows the line
  }
}

void Progress::step(int64_t stepInEpoch, int64_t samples, double loss) {
  stepInEpoch_ = stepInEpoch;
  samples_ += samples;
  if (!std::isnan(loss)) {
    lossSum_ += loss * static_cast<double>(samples);
    lossSamples_ += samples;
  }
  if (options_.mode == ProgressMode::kOff) return;
  const double now = options_.clock();
  if (now < nextDue_) return;
  show(now);
  if (options_.mode == ProgressMode::kPlain) {
    // On the interval's grid, so the lines keep their rhythm; after a stall longer than the
    // interval, one line and then a fresh grid rather than a burst of catch-up lines.
    nextDue_ += interval_;
    if (nextDue_ <= now) nextDue_ = now + interval_;
  } else {
    nextDue_ = now + interval_;
  }
}

void Progress::endEpoch() {
  if (showing_) {
    if (options_.mode == ProgressMode::kTerminal) writeLine(kEraseLine);
    if (options_.mode == ProgressMode::kLauncher) {
      size_t len = 0;
      appendBytes(line_, sizeof line_, len, kProgressMarker);
      appendBytes(line_, sizeof line_, len, "\n");
      writeLine(std::string_view(line_, len));
    }
    showing_ = false;
  }
  if (options_.mode != ProgressMode::kPlain) nextDue_ = kNever;
}

void Progress::clearLine() {
  if (options_.mode != ProgressMode::kTerminal || !showing_) return;
  writeLine(kEraseLine);
  showing_ = false;
  nextDue_ = kNever;
}

size_t Progress::formatText(double now) {
  constexpr size_t cap = sizeof text_;
  size_t len = 0;
  const long long total = static_cast<long long>(options_.stepsPerEpoch);
  appendf(text_, cap, len, "epoch %lld/%lld step %lld", static_cast<long long>(epoch_ + 1),
          static_cast<long long>(options_.epochs), static_cast<long long>(stepInEpoch_));
  if (total > 0) {
    appendf(text_, cap, len, "/%lld (%lld%%)", total, static_cast<long long>(stepInEpoch_) * 100 / total);
  }
  const double elapsed = now - epochStart_;
  if (elapsed > 0 && samples_ > 0) {
    const double perSecond = static_cast<double>(samples_) * static_cast<double>(options_.samplesScale) / elapsed;
    appendf(text_, cap, len, " %lld samples/s", std::llround(perSecond));
  }
  if (lossSamples_ > 0) appendf(text_, cap, len, " loss %.4g", lossSum_ / static_cast<double>(lossSamples_));
  const int64_t done = stepInEpoch_ - firstStep_;
  if (elapsed > 0 && done > 0 && total > 0) {
    const double stepSeconds = elapsed / static_cast<double>(done);
    int64_t epochSteps = total - stepInEpoch_;
    int64_t runSteps = epochSteps + std::max<int64_t>(options_.epochs - epoch_ - 1, 0) * total;
    if (options_.maxSteps > 0) {
      const int64_t toStop = std::max<int64_t>(options_.maxSteps - (epoch_ * total + stepInEpoch_), 0);
      epochSteps = std::min(epochSteps, toStop);
      runSteps = std::min(runSteps, toStop);
    }
    appendf(text_, cap, len, " ETA epoch ");
    appendDuration(text_, cap, len, stepSeconds * static_cast<double>(epochSteps));
    appendf(text_, cap, len, " run ");
    appendDuration(text_, cap, len, stepSeconds * static_cast<double>(runSteps));
  }
  return len;
}

void Progress::show(double now) {
  const std::string_view text(text_, formatText(now));
  constexpr size_t cap = sizeof line_;
  size_t len = 0;
  switch (options_.mode) {
    case ProgressMode::kPlain:
      appendBytes(line_, cap - 1, len, options_.prefix);
      appendBytes(line_, cap - 1, len, "progress: ");
      appendBytes(line_, cap - 1, len, text);
      appendBytes(line_, cap, len, "\n");
      break;
    case ProgressMode::kTerminal: {
      // Never as wide as the terminal: a line that wraps (or leaves the cursor past the last
      // column) can no longer be rewritten from its start with "\r".
      constexpr std::string_view kEraseToEnd = "\x1b[K";
      const int columns = terminalColumns();
      size_t end = cap - kEraseToEnd.size();                                       // where the visible text stops
      if (columns > 0) end = std::min(end, 1 + static_cast<size_t>(columns - 1));  // "\r", columns - 1 characters
      appendBytes(line_, cap, len, "\r");
      appendBytes(line_, end, len, options_.prefix);
      appendBytes(line_, end, len, text);
      appendBytes(line_, cap, len, kEraseToEnd);
      break;
    }
    case ProgressMode::kLauncher:
      appendBytes(line_, cap - 1, len, kProgressMarker);
      appendBytes(line_, cap - 1, len, text);
      appendBytes(line_, cap, len, "\n");
      break;
    case ProgressMode::kOff:
      return;
  }
  writeLine(std::string_view(line_, len));
  showing_ = options_.mode != ProgressMode::kPlain;
}

void Progress::writeLine(std::string_view bytes) const {
  while (!bytes.empty()) {
    const ssize_t n = ::write(options_.fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed terminal or pipe must not stop training
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

int Progress::terminalColumns() const {
  winsize size{};
  if (::ioctl(options_.fd, TIOCGWINSZ, &size) != 0) return 0;
  return size.ws_col;
}

}  // namespace cohort::train
