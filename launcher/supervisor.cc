#include "launcher/supervisor.h"

#include <poll.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>

#include "ipc/private_dir.h"
#include "ipc/process_liveness.h"
#include "ipc/rank_roster.h"
#include "ipc/shm_names.h"
#include "runtime/error.h"
#include "runtime/unique_fd.h"

namespace cohort::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// The longest the poll loop sleeps: a bound on every wait, and how late a missed wake-up can be.
constexpr int kMaxPollMs = 1000;
// While a worker's exit 0 waits to be judged (a worker making its Job wakes nothing up).
constexpr int kEarlyExitPollMs = 50;

std::string formatSeconds(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os << static_cast<double>(ms.count()) / 1000.0 << " s";
  return os.str();
}

std::string workerName(const WorkerProcess& w) {
  return "rank " + std::to_string(w.rank()) + " (pid " + std::to_string(w.pid()) + ")";
}

bool stopsTheJob(int signal) { return signal == SIGINT || signal == SIGTERM || signal == SIGHUP; }

bool startedIgnoring(int signal) {
  struct sigaction action {};
  return ::sigaction(signal, nullptr, &action) == 0 && action.sa_handler == SIG_IGN;
}

// SIGHUP and SIGTSTP are supervised unless cohortrun was started with them ignored (nohup; a shell
// without job control): a blocked signal is queued even when its action is to ignore it, so taking
// it into the signalfd would undo what was asked. SIGCONT continues cohortrun however it is
// handled; the signalfd only tells the supervisor, so that it continues the workers too.
std::vector<int> supervisedSignals() {
  std::vector<int> signals = {SIGINT, SIGTERM, SIGUSR1, SIGCHLD, SIGCONT};
  for (int signal : {SIGHUP, SIGTSTP}) {
    if (!startedIgnoring(signal)) signals.push_back(signal);
  }
  return signals;
}

}  // namespace

void Supervisor::say(const std::string& message) { pump_.writeOwn("cohortrun: " + message + "\n"); }

struct Supervisor::Attempt {
  int restartCount = 0;
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  int interruptSignal = 0;  // SIGINT, SIGTERM or SIGHUP received by cohortrun, or 0
  std::optional<Failure> failure;
  std::optional<Clock::time_point> killDeadline;  // when the survivors get SIGKILL
  int stopSignal = 0;                             // what they were asked to stop with
  bool killSent = false;
  std::optional<ipc::RankRoster> roster;   // the workers' pids and whether each finished its Job
  std::vector<WorkerProcess*> earlyExits;  // exited 0, unfinished, while others ran: to be judged

  bool anyRunning() const {
    return std::any_of(workers.begin(), workers.end(), [](const auto& w) { return !w->reaped(); });
  }
  // Also when a worker cannot be executed: the roster is not one of the segments the report counts.
  ~Attempt() {
    if (roster) roster->unlink();
  }
};

Supervisor::Supervisor(const LaunchPlan& plan)
    : plan_(plan),
      signals_(supervisedSignals()),
      pump_(OutputPumpOptions{
          .worldSize = plan.worldSize, .logDir = plan.logDir, .jobId = plan.jobId, .liveStatus = plan.liveStatus}) {}

Supervisor::~Supervisor() = default;

int Supervisor::run() {
  // Every per-job name lives in this user's private shared-memory directory: one that another user
  // made is refused here, before anything starts (InvalidArgument, exit 2; ipc/private_dir.h).
  ipc::openPrivateDirectory();
  try {
    for (const std::string& name : ipc::sweepStaleSegments()) {
      say("removed stale shared-memory segment " + name + " (its job is gone)");
    }
  } catch (const Error& e) {
    say(std::string("warning: sweeping stale shared-memory segments failed: ") + e.what());
  }
  // After the daemon: a daemon that cannot start is the job's one line.
  startMps();
  if (!plan_.mpsNote.empty()) say(plan_.mpsNote);
  int code = 0;
  try {
    code = runAttempts();
  } catch (...) {
    // The attempt's workers are gone by now (their owners were destroyed while unwinding).
    removeSegments(true);
    stopMps();
    throw;
  }
  stopMps();
  return code;
}

void Supervisor::startMps() {
  if (!plan_.mps) return;
  mps_ = MpsDaemon::start(
      {.jobDirectory = plan_.jobDirectory, .environment = plan_.baseEnvironment, .timeout = plan_.mpsTimeout});
  say("started an MPS control daemon for this job (CUDA_MPS_PIPE_DIRECTORY=" + mps_->pipeDirectory() + ")");
}

void Supervisor::stopMps() {
  if (!mps_) return;
  for (const std::string& warning : mps_->stop()) say("warning: " + warning);
  mps_.reset();
}

int Supervisor::runAttempts() {
  for (int restart = 0;; ++restart) {
    if (int signal = pendingInterrupt()) return 128 + signal;
    Attempt attempt;
    attempt.restartCount = restart;
    runAttempt(attempt);
    awaitGroupsGone(attempt);
    removeSegments(attempt.interruptSignal != 0 || attempt.failure.has_value());
    if (attempt.interruptSignal != 0) return 128 + attempt.interruptSignal;
    if (!attempt.failure) return 0;
    if (restart >= plan_.maxRestarts) return attempt.failure->exitCode();
    say("restarting the group (attempt " + std::to_string(restart + 2) + " of " +
        std::to_string(plan_.maxRestarts + 1) + ") after rank " + std::to_string(attempt.failure->rank) + " " +
        attempt.failure->describe());
  }
}

std::string Supervisor::Failure::describe() const {
  return leftEarly ? "exited with code 0 before the job finished" : status.describe();
}

int Supervisor::Failure::exitCode() const {
  return leftEarly ? static_cast<int>(ExitCode::kPeerFailed) : status.launcherExitCode();
}

void Supervisor::openRoster(Attempt& attempt) {
  try {
    attempt.roster.emplace(ipc::RankRoster::createForLauncher(plan_.jobId, plan_.worldSize));
  } catch (const Error& e) {
    // The job can run without it; only an early exit 0 would go unnoticed.
    if (attempt.restartCount == 0) {
      say(std::string("warning: ") + e.what() + "; a worker that exits 0 early will not be noticed");
    }
  }
}

void Supervisor::runAttempt(Attempt& attempt) {
  pump_.beginAttempt(attempt.restartCount);
  openRoster(attempt);
  for (int rank = 0; rank < plan_.worldSize; ++rank) {
    std::vector<std::string> environment = plan_.environmentFor(rank, attempt.restartCount);
    if (mps_) environment.insert(environment.end(), mps_->environment().begin(), mps_->environment().end());
    attempt.workers.push_back(WorkerProcess::spawn(SpawnOptions{
        .rank = rank,
        .argv = plan_.command,
        .environment = environment,
        .cpus = plan_.cpusOfRank.empty() ? std::vector<int>{} : plan_.cpusOfRank[static_cast<size_t>(rank)]}));
    if (attempt.roster) attempt.roster->recordStarted(rank, attempt.workers.back()->pid());
  }
  while (attempt.anyRunning()) pollOnce(attempt);
  if (attempt.roster) attempt.roster->unlink();  // before the report counts the job's segments
  pump_.clearStatus();  // the job's messages and the shell's prompt start on a clean row
}

void Supervisor::pollOnce(Attempt& attempt) {
  struct Source {
    WorkerProcess* worker;
    StreamKind stream;
  };
  std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
  std::vector<Source> sources;
  for (const auto& w : attempt.workers) {
    if (w->stdoutPipe()) sources.push_back({w.get(), StreamKind::kStdout});
    if (w->stderrPipe()) sources.push_back({w.get(), StreamKind::kStderr});
  }
  for (const Source& s : sources) {
    runtime::UniqueFd& fd = s.stream == StreamKind::kStdout ? s.worker->stdoutPipe() : s.worker->stderrPipe();
    fds.push_back({fd.get(), POLLIN, 0});
  }
  int timeoutMs = attempt.earlyExits.empty() || attempt.failure ? kMaxPollMs : kEarlyExitPollMs;
  if (attempt.killDeadline && !attempt.killSent) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*attempt.killDeadline - Clock::now());
    timeoutMs = static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, timeoutMs));
  }
  int ready = ::poll(fds.data(), fds.size(), timeoutMs);
  if (ready < 0 && errno != EINTR) COHORT_THROW(Error) << "poll: " << std::strerror(errno);
  if (ready > 0) {
    if (fds[0].revents != 0) handleSignals(attempt);
    for (size_t i = 0; i < sources.size(); ++i) {
      if (fds[i + 1].revents == 0) continue;
      const Source& s = sources[i];
      runtime::UniqueFd& fd = s.stream == StreamKind::kStdout ? s.worker->stdoutPipe() : s.worker->stderrPipe();
      if (!pump_.drain(fd.get(), s.worker->rank(), s.stream)) {
        pump_.endOfStream(s.worker->rank(), s.stream);
        fd.reset();
      }
    }
  }
  reapExited(attempt);
  escalateIfDue(attempt);
}

void Supervisor::handleSignals(Attempt& attempt) {
  for (int signal : signals_.readPending()) {
    if (signal == SIGCHLD) continue;  // reapExited() checks every worker after each poll
    if (signal == SIGUSR1 || signal == SIGCONT) {
      for (const auto& w : attempt.workers) w->signal(signal);
      continue;
    }
    if (signal == SIGTSTP) {
      suspend(attempt);
      continue;
    }
    if (attempt.interruptSignal == 0) {  // SIGINT, SIGTERM or SIGHUP: stop the job, no restart
      attempt.interruptSignal = signal;
      if (signal == SIGHUP) {
        // The terminal went away, which says nothing to the workers: they get SIGTERM, as under
        // torchrun, so that they can checkpoint and leave.
        say("got SIGHUP; stopping the workers: SIGTERM now, SIGKILL after " + formatSeconds(plan_.gracePeriod));
        stopWorkers(attempt, SIGTERM);
      } else {
        say("got " + signalName(signal) + "; forwarding it to the workers (SIGKILL after " +
            formatSeconds(plan_.gracePeriod) + ")");
        stopWorkers(attempt, signal);
      }
    } else if (!attempt.killSent) {
      say("got " + signalName(signal) + " again; sending SIGKILL to the workers now");
      for (const auto& w : attempt.workers) w->signal(SIGKILL);
      attempt.killSent = true;
    }
  }
}

// Ctrl-Z, as a shell's job control does it: the terminal's SIGTSTP reaches only cohortrun's process
// group, so every worker's group gets SIGSTOP (a stop no handler can refuse), then cohortrun stops
// itself; once continued (fg, bg, SIGCONT) it continues every group. Time spent stopped is not
// the workers' time: a pending SIGKILL deadline moves by it, so a grace period is never used up
// while nobody could act on it.
void Supervisor::suspend(Attempt& attempt) {
  const auto stopped = Clock::now();
  for (const auto& w : attempt.workers) w->signal(SIGSTOP);
  signals_.stopThisProcess(SIGTSTP);
  for (const auto& w : attempt.workers) w->signal(SIGCONT);
  if (attempt.killDeadline && !attempt.killSent) *attempt.killDeadline += Clock::now() - stopped;
}

void Supervisor::reapExited(Attempt& attempt) {
  std::vector<WorkerProcess*> failed, exitedZero;
  for (const auto& w : attempt.workers) {
    if (!w->tryReap()) continue;
    closePipes(*w);
    (w->status()->ok() ? exitedZero : failed).push_back(w.get());
  }
  // Exits 0 of workers that had not finished their Job, while others still run.
  if (attempt.roster && attempt.anyRunning()) {
    for (WorkerProcess* w : exitedZero) {
      if (attempt.roster->stateOf(w->rank()) != ipc::RosterState::kFinished) attempt.earlyExits.push_back(w);
    }
  }
  // Before the failures found now: a peer that noticed the early exit fails with 4 (a peer failed).
  judgeEarlyExits(attempt);
  if (failed.empty() || attempt.failure || attempt.interruptSignal != 0) return;
  // Several found dead at once: blame one that did not merely report a failed peer (exit code 4).
  auto blamed = std::find_if(failed.begin(), failed.end(), [](WorkerProcess* w) {
    return w->status()->launcherExitCode() != static_cast<int>(ExitCode::kPeerFailed);
  });
  WorkerProcess* first = blamed != failed.end() ? *blamed : failed.front();
  attempt.failure = Failure{first->rank(), first->pid(), *first->status()};
  reportFailure(*attempt.failure);
  stopWorkers(attempt, SIGTERM);
}

// An exit 0 is an early exit only in a job whose workers use the Cohort runtime (one has made its
// train::Job); until one has, it stays pending, and a job whose workers never do ends normally.
void Supervisor::judgeEarlyExits(Attempt& attempt) {
  if (attempt.earlyExits.empty() || attempt.failure || attempt.interruptSignal != 0) return;
  if (!attempt.roster->anyJoined()) return;
  WorkerProcess* first = attempt.earlyExits.front();
  attempt.failure = Failure{first->rank(), first->pid(), *first->status(), true};
  attempt.earlyExits.clear();
  reportFailure(*attempt.failure);
  stopWorkers(attempt, SIGTERM);
}

void Supervisor::closePipes(WorkerProcess& worker) {
  // The worker is dead: what it wrote is already in the pipes. One more read each, then close (a
  // grandchild that escaped its process group may hold the write end open forever).
  for (StreamKind stream : {StreamKind::kStdout, StreamKind::kStderr}) {
    runtime::UniqueFd& fd = stream == StreamKind::kStdout ? worker.stdoutPipe() : worker.stderrPipe();
    if (!fd) continue;
    pump_.drain(fd.get(), worker.rank(), stream);
    pump_.endOfStream(worker.rank(), stream);
    fd.reset();
  }
}

void Supervisor::reportFailure(const Failure& failure) {
  std::string text = "cohortrun: rank " + std::to_string(failure.rank) + " (pid " + std::to_string(failure.pid) + ") " +
                     failure.describe() + "\n";
  const auto& tail = pump_.tail(failure.rank);
  if (!tail.empty()) {
    text += "cohortrun: last " + std::to_string(tail.size()) + " lines of rank " + std::to_string(failure.rank) + ":\n";
    for (const std::string& line : tail) text += "    " + line + "\n";
  }
  pump_.writeOwn(text);
}

void Supervisor::stopWorkers(Attempt& attempt, int signal) {
  int running = 0;
  for (const auto& w : attempt.workers) {
    if (w->reaped()) continue;
    w->signal(signal);
    // A stopped worker (SIGSTOP) would act on the signal only once it is continued, that is, it would
    // hold the job for the whole grace period and then lose its handler's work to SIGKILL.
    w->signal(SIGCONT);
    ++running;
  }
  if (running == 0 || attempt.killSent) return;
  if (signal == SIGTERM && attempt.failure && attempt.interruptSignal == 0) {
    say("stopping the other " + std::to_string(running) + " worker(s): SIGTERM now, SIGKILL after " +
        formatSeconds(plan_.gracePeriod));
  }
  auto deadline = Clock::now() + plan_.gracePeriod;
  if (!attempt.killDeadline || deadline < *attempt.killDeadline) {
    attempt.killDeadline = deadline;
    attempt.stopSignal = signal;
  }
}

void Supervisor::escalateIfDue(Attempt& attempt) {
  if (!attempt.killDeadline || attempt.killSent || Clock::now() < *attempt.killDeadline) return;
  for (const auto& w : attempt.workers) {
    if (w->reaped()) continue;
    say(workerName(*w) + " still running " + formatSeconds(plan_.gracePeriod) + " after " +
        signalName(attempt.stopSignal) + "; sending SIGKILL (--grace-period gives workers longer to checkpoint)");
    w->signal(SIGKILL);
  }
  attempt.killSent = true;
}

// A worker's leftovers (a wrapper script's child outliving it) were sent SIGKILL when it was reaped,
// but a process dies when it leaves the kernel, which may take a while (writing a checkpoint to
// disk): the next attempt, or the next job, must not start while one still holds its rank or files.
void Supervisor::awaitGroupsGone(const Attempt& attempt) {
  const std::chrono::milliseconds bound = std::max(plan_.gracePeriod, std::chrono::milliseconds(5000));
  const auto deadline = Clock::now() + bound;
  for (const auto& w : attempt.workers) {
    // The leader is reaped: its group lives on only in its leftovers, and its id is not reused while
    // they do.
    while (ipc::groupHasLiveMember(w->pid())) {
      if (Clock::now() >= deadline) {
        say("warning: processes of " + workerName(*w) + "'s group are still there " + formatSeconds(bound) +
            " after it ended (SIGKILLed, not yet gone)");
        return;
      }
      ::poll(nullptr, 0, 2);
    }
  }
}

void Supervisor::removeSegments(bool announceRemoved) {
  try {
    std::vector<std::string> removed = ipc::removeJobSegments(plan_.jobId);
    if (announceRemoved && !removed.empty()) {
      say("removed " + std::to_string(removed.size()) + " shared-memory segment(s) of job " + plan_.jobId);
    }
  } catch (const Error& e) {
    say(std::string("warning: ") + e.what());
  }
}

int Supervisor::pendingInterrupt() {
  for (int signal : signals_.readPending()) {
    if (stopsTheJob(signal)) return signal;
    if (signal == SIGTSTP) signals_.stopThisProcess(SIGTSTP);  // between attempts: no worker to stop
  }
  return 0;
}

}  // namespace cohort::launcher
