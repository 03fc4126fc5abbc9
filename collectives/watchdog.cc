#include "collectives/watchdog.h"

#include <sstream>
#include <utility>

#include "runtime/error.h"

namespace cohort::collectives {
namespace {

std::string seconds(std::chrono::milliseconds d) {
  std::ostringstream os;
  os << static_cast<double>(d.count()) / 1000.0 << " s";
  return os.str();
}

}  // namespace

CollectiveWatchdog::CollectiveWatchdog(Hooks hooks, Options options)
    : hooks_(std::move(hooks)), options_(std::move(options)), thread_([this] { run(); }) {}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void CollectiveWatchdog::track(const Fingerprint& fingerprint, ProbeFn probe) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_) std::rethrow_exception(error_);
  entries_.push_back({fingerprint, std::move(probe), std::chrono::steady_clock::now() + options_.timeout});
}

void CollectiveWatchdog::rethrowIfFailed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_) std::rethrow_exception(error_);
}

bool CollectiveWatchdog::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_ != nullptr;
}

size_t CollectiveWatchdog::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

void CollectiveWatchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_ && !error_) {
    wake_.wait_for(lock, options_.pollInterval, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    std::exception_ptr error = poll();
    if (error) fail(error);
    lock.lock();
  }
}

std::exception_ptr CollectiveWatchdog::poll() {
  // The backend's own error first: it says why, where a timeout could only say that.
  if (hooks_.asyncError) {
    if (std::string why = hooks_.asyncError(); !why.empty()) {
      std::lock_guard<std::mutex> lock(mutex_);
      std::ostringstream os;
      os << options_.backend << " reported an error on rank " << options_.rank;
      if (!entries_.empty()) os << " during " << entries_.front().fingerprint.str();
      os << ": " << why << "; the communicator was aborted";
      return std::make_exception_ptr(PeerError(os.str()));
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  for (auto it = entries_.begin(); it != entries_.end();) {
    Probe p = it->probe();
    if (p.state == State::kDone) {
      it = entries_.erase(it);
      continue;
    }
    std::ostringstream os;
    if (p.state == State::kFailed) {
      os << options_.backend << " " << it->fingerprint.str() << " failed on rank " << options_.rank << ": " << p.error
         << "; the communicator was aborted";
      return std::make_exception_ptr(PeerError(os.str()));
    }
    if (now >= it->deadline) {
      os << options_.backend << " " << it->fingerprint.str() << " did not complete within " << seconds(options_.timeout)
         << " on rank " << options_.rank
         << " (a peer may have died, stalled or issued other collectives); the communicator was aborted";
      return std::make_exception_ptr(TimeoutError(os.str()));
    }
    ++it;
  }
  return nullptr;
}

void CollectiveWatchdog::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) return;
    error_ = error;
    entries_.clear();
  }
  if (hooks_.abort) hooks_.abort();
}

}  // namespace cohort::collectives
