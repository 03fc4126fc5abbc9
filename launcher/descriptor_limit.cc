#include "launcher/descriptor_limit.h"

#include <dirent.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include "runtime/error.h"

namespace cohort::launcher {
namespace {

// The descriptors open now (the directory stream's own one not counted); 3 when /proc is missing.
int openDescriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return 3;
  int n = 0;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(dir);
  return n - 1;
}

}  // namespace

int descriptorsNeeded(const DescriptorNeedOptions& options, int openNow) {
  constexpr int kSignalFd = 1, kPerWorker = 2, kWhileStarting = 5;
  return openNow + kSignalFd + options.workers * (kPerWorker + (options.logFiles ? 1 : 0)) + kWhileStarting +
         kDescriptorMargin;
}

void ensureDescriptors(const DescriptorNeedOptions& options) {
  const int openNow = openDescriptors();
  const int needed = descriptorsNeeded(options, openNow);
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0)
    COHORT_THROW(Error) << "getrlimit(RLIMIT_NOFILE): " << std::strerror(errno);
  const auto need = static_cast<rlim_t>(needed);
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= need) return;
  if (limit.rlim_max == RLIM_INFINITY || limit.rlim_max >= need) {
    const rlim_t soft = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &limit) == 0) return;
    limit.rlim_cur = soft;
  }
  COHORT_THROW(InvalidArgument) << "this job needs " << needed << " file descriptors for " << options.workers
                                << " worker(s) (" << openNow << " open now, 2 pipes per worker"
                                << (options.logFiles ? " and its log file" : "") << ", its signals, /dev/null and "
                                << kDescriptorMargin << " for the job's files), but the limit of open files is "
                                << limit.rlim_cur << " (ulimit -n; hard limit " << limit.rlim_max
                                << "): raise it (ulimit -n " << needed << " or more) or start fewer workers";
}

}  // namespace cohort::launcher
