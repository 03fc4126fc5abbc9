// Logger: rank-prefixed log lines ("[rank 1] epoch 2 ...").
//
// Under cohortrun (WorldInfo::source == "cohortrun") the launcher prefixes every output line of a
// worker with its rank, so the Logger writes lines without a prefix of its own.
// A Logger is made from the WorldInfo and passed explicitly (no global). Each LogLine collects one
// message with operator<< and writes it, prefix and newline included, with a single write() when it
// goes out of scope, so lines of different ranks sharing a terminal never interleave mid-line.
// Thread safety: a Logger may be used from several threads; each line is written atomically.
//
//   Logger log(world);
//   log.info() << "epoch " << e << " loss " << loss;
#pragma once

#include <cstdio>
#include <sstream>
#include <string>

#include "runtime/world_info.h"

namespace cohort::runtime {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

class Logger;

class LogLine {
 public:
  LogLine(const Logger& logger, LogLevel level, bool enabled);
  LogLine(LogLine&&) = default;
  ~LogLine();
  template <class T>
  LogLine& operator<<(const T& v) {
    if (enabled_) os_ << v;
    return *this;
  }

 private:
  const Logger& logger_;
  LogLevel level_;
  bool enabled_;
  std::ostringstream os_;
};

class Logger {
 public:
  struct Options {
    LogLevel minLevel = LogLevel::kInfo;
    int fd = 2;  // file descriptor the lines go to (stderr by default)
  };
  explicit Logger(const WorldInfo& world) : Logger(world, Options{}) {}
  Logger(const WorldInfo& world, Options options);

  LogLine debug() const { return LogLine(*this, LogLevel::kDebug, enabled(LogLevel::kDebug)); }
  LogLine info() const { return LogLine(*this, LogLevel::kInfo, enabled(LogLevel::kInfo)); }
  LogLine warn() const { return LogLine(*this, LogLevel::kWarn, enabled(LogLevel::kWarn)); }
  LogLine error() const { return LogLine(*this, LogLevel::kError, enabled(LogLevel::kError)); }

  bool enabled(LogLevel level) const { return level >= options_.minLevel; }
  const std::string& prefix() const { return prefix_; }
  // Writes `text` (which must end in a newline) with one write() call.
  void writeRaw(const std::string& text) const;

 private:
  std::string prefix_;
  Options options_;
};

}  // namespace cohort::runtime
