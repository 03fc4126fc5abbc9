#include "runtime/logging.h"

#include <unistd.h>

namespace cohort::runtime {

LogLine::LogLine(const Logger& logger, LogLevel level, bool enabled)
    : logger_(logger), level_(level), enabled_(enabled) {}

LogLine::~LogLine() {
  if (!enabled_) return;
  const char* tag = level_ == LogLevel::kWarn ? "warning: " : level_ == LogLevel::kError ? "error: " : "";
  logger_.writeRaw(logger_.prefix() + tag + os_.str() + "\n");
}

// cohortrun prefixes every line of its workers itself, so a worker it started writes bare lines.
Logger::Logger(const WorldInfo& world, Options options)
    : prefix_(world.source == "cohortrun" ? "" : "[rank " + std::to_string(world.rank) + "] "), options_(options) {}

void Logger::writeRaw(const std::string& text) const {
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(options_.fd, p, left);
    if (n <= 0) return;  // a closed terminal must not take the job down
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace cohort::runtime
