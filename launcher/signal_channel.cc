#include "launcher/signal_channel.h"

#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "runtime/error.h"

namespace cohort::launcher {

SignalChannel::SignalChannel(const std::vector<int>& signals) {
  sigset_t mask;
  sigemptyset(&mask);
  for (int s : signals) sigaddset(&mask, s);
  if (sigprocmask(SIG_BLOCK, &mask, &previousMask_) != 0) {
    COHORT_THROW(Error) << "sigprocmask: " << std::strerror(errno);
  }
  fd_ = runtime::UniqueFd(signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!fd_) {
    int err = errno;
    sigprocmask(SIG_SETMASK, &previousMask_, nullptr);
    COHORT_THROW(Error) << "signalfd: " << std::strerror(err);
  }
}

SignalChannel::~SignalChannel() {
  fd_.reset();
  sigprocmask(SIG_SETMASK, &previousMask_, nullptr);
}

std::vector<int> SignalChannel::readPending() {
  std::vector<int> signals;
  signalfd_siginfo info;
  for (;;) {
    ssize_t n = ::read(fd_.get(), &info, sizeof info);
    if (n == static_cast<ssize_t>(sizeof info)) {
      signals.push_back(static_cast<int>(info.ssi_signo));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return signals;  // EAGAIN: nothing more
  }
}

void SignalChannel::stopThisProcess(int signal) {
  struct sigaction byDefault {};
  struct sigaction previous {};
  byDefault.sa_handler = SIG_DFL;
  ::sigaction(signal, &byDefault, &previous);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, signal);
  ::raise(signal);                          // pending while blocked...
  sigprocmask(SIG_UNBLOCK, &one, nullptr);  // ...delivered here: the process stops until continued
  sigprocmask(SIG_BLOCK, &one, nullptr);
  ::sigaction(signal, &previous, nullptr);
}

void unblockAllSignalsInChild() {
  sigset_t empty;
  sigemptyset(&empty);
  sigprocmask(SIG_SETMASK, &empty, nullptr);
}

std::string signalName(int signal) {
  const char* abbrev = sigabbrev_np(signal);  // glibc >= 2.32: "KILL" for 9
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
}

}  // namespace cohort::launcher
