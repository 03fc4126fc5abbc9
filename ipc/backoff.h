// Backoff: how Cohort's shared-memory waits pass time without burning a core or sleeping long.
//
// The first kSpins calls return at once after a CPU pause hint (a peer usually arrives within
// microseconds); after that each call sleeps, starting at 50 µs and doubling up to `maxSleep`
// (10 ms by default), so a wait reacts within maxSleep and a long one costs almost nothing.
// The caller re-checks its condition and its deadline after every call.
// Thread safety: a value type; use one per waiting thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace cohort::ipc {

class Backoff {
 public:
  explicit Backoff(std::chrono::microseconds maxSleep = std::chrono::milliseconds(10)) : maxSleep_(maxSleep) {}

  void pause() {
    if (spins_ < kSpins) {
      ++spins_;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, maxSleep_);
  }

 private:
  static constexpr int kSpins = 2000;
  std::chrono::microseconds maxSleep_;
  std::chrono::microseconds sleep_{50};
  int spins_ = 0;
};

}  // namespace cohort::ipc
