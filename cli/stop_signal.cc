#include "cli/stop_signal.h"

#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace cohort::cli {

StopSignals& installStopSignals() {
  static StopSignals flags;
  sigset_t set;
  sigemptyset(&set);
  for (int signal : {SIGUSR1, SIGTERM, SIGHUP}) sigaddset(&set, signal);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int signal = 0;
    while (sigwait(&set, &signal) == 0) {
      if (signal != SIGUSR1) {
        const char* name = signal == SIGTERM ? "SIGTERM" : "SIGHUP";
        if (!flags.trainingReady.load()) {
          std::fprintf(stderr, "cohort: %s before training began: leaving now (exit %d)\n", name, 128 + signal);
          std::_Exit(128 + signal);
        }
        if (flags.terminating.exchange(signal) != 0) {
          std::fprintf(stderr, "cohort: %s again: leaving now, without a checkpoint\n", name);
          std::_Exit(128 + signal);
        }
        std::fprintf(stderr, "cohort: %s: stopping %s (with a checkpoint where --checkpoint is given); "
                             "send it again to leave at once\n",
                     name, flags.stopsAtEpochEnd.load() ? "at the end of this epoch (Hogwild workers across nodes meet only there)"
                                                   : "after this step");
      }
      flags.signal.store(signal, std::memory_order_relaxed);
      flags.requested.store(true, std::memory_order_relaxed);
    }
  }).detach();
  return flags;
}

}  // namespace cohort::cli
