// Supervisor: runs a LaunchPlan to the end — spawns the workers, pumps their output, forwards
// signals, stops the group when one worker fails, restarts it, cleans up shared memory — and
// returns cohortrun's exit code (docs/launcher.md).
//
// One attempt: spawn ranks 0..N-1 (WorkerProcess), then a poll() loop over a signalfd and every
// worker's stdout/stderr pipe, with a timeout of at most one second, until every worker is reaped.
//  - SIGINT / SIGTERM: forwarded to every worker; after the grace period the survivors get SIGKILL;
//    a second one sends SIGKILL at once. The job then exits 130 / 143 and is never restarted.
//  - SIGHUP (its terminal closed): the same, except that the workers get SIGTERM; exits 129. Unless
//    cohortrun was started with SIGHUP ignored (nohup): then it stays ignored.
//  - SIGUSR1: forwarded; nothing else.
//  - SIGTSTP (Ctrl-Z): every worker's process group gets SIGSTOP, then cohortrun stops itself; on
//    SIGCONT (fg, bg) every group gets SIGCONT. A SIGKILL deadline moves by the time stopped. Not
//    supervised when cohortrun was started with SIGTSTP ignored. SIGTTIN and SIGTTOU keep their
//    default (cohortrun never reads the terminal; its workers' output waits in their pipes).
//  - A worker that exits non-zero or by a signal is the first failure (if none yet and no signal was
//    received): it is reported with its last output lines, the others get SIGTERM, then SIGKILL
//    after the grace period.
//  - So is a worker that exits 0 while others still run, when the workers use the Cohort runtime
//    and it did not finish its train::Job (the job's roster, ipc/rank_roster.h, which cohortrun
//    makes before each attempt and in which it records every worker's pid): "exited with code 0
//    before the job finished", exit code 4. Until some worker has made its Job the judgement waits
//    (polling every 50 ms): a program that never uses the runtime may end its ranks in any order.
// Every SIGTERM/SIGINT that stops workers is followed by SIGCONT, so that a stopped worker acts on
// it at once instead of holding the job for the grace period.
// Output: OutputPump, with rank 0's live progress as a status line when the plan says
// (LaunchPlan::liveStatus), erased at each attempt's end; cohortrun's own messages go through the
// pump so that they never land inside it.
// After the attempt, the job's shared-memory segments are removed; a failed attempt is followed by a
// new one (COHORT_RESTART_COUNT + 1) while restarts remain. Stale segments of dead jobs are swept
// once before the first attempt.
// Before the first attempt, with --mps, a private MPS control daemon (MpsDaemon) is started: every
// worker of every attempt gets its CUDA_MPS_* variables, and it is stopped after the last attempt
// however the job ends (a failure, a signal, an exception); its warnings are said then. Then the
// plan's mpsNote (workers share a GPU without MPS; --mps where none is shared) is said, once.
// Exit code: 128 + the signal received; else the first failure's code (128 + signal for a worker
// killed by one); else 0. An unexecutable PROGRAM throws InvalidArgument.
// Ownership: owns the workers, the signalfd, the log files and the MPS daemon; nothing survives it
// (see WorkerProcess). Thread safety: none; construct and run it on the main thread, which must be the
// only thread (forks, signal mask, parent-death signal).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/launch_plan.h"
#include "launcher/mps_daemon.h"
#include "launcher/output_pump.h"
#include "launcher/signal_channel.h"
#include "launcher/worker_process.h"

namespace cohort::launcher {

class Supervisor {
 public:
  explicit Supervisor(const LaunchPlan& plan);  // throws IoError for an unusable log directory
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;
  ~Supervisor();

  int run();

 private:
  struct Failure {
    int rank = 0;
    pid_t pid = 0;
    ExitStatus status;
    bool leftEarly = false;  // exited 0 before the job finished (see judgeEarlyExits)

    // "exited with code 3", or "exited with code 0 before the job finished".
    std::string describe() const;
    // cohortrun's exit code for it: the worker's (128 + signal), or 4 for one that left early.
    int exitCode() const;
  };
  struct Attempt;  // the state of one attempt (supervisor.cc)

  int runAttempts();
  void startMps();
  void stopMps();
  void runAttempt(Attempt& attempt);
  void pollOnce(Attempt& attempt);
  void handleSignals(Attempt& attempt);
  void suspend(Attempt& attempt);
  void reapExited(Attempt& attempt);
  void judgeEarlyExits(Attempt& attempt);
  void openRoster(Attempt& attempt);
  void closePipes(WorkerProcess& worker);
  void reportFailure(const Failure& failure);
  void stopWorkers(Attempt& attempt, int signal);
  void escalateIfDue(Attempt& attempt);
  void awaitGroupsGone(const Attempt& attempt);
  void removeSegments(bool announce);
  int pendingInterrupt();
  // "cohortrun: <message>\n" on stderr through the pump, around rank 0's status line.
  void say(const std::string& message);

  LaunchPlan plan_;
  SignalChannel signals_;
  OutputPump pump_;
  std::unique_ptr<MpsDaemon> mps_;  // --mps: the job's MPS control daemon
};

}  // namespace cohort::launcher
