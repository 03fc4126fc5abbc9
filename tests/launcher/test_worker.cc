// test_worker: a stand-in worker for the cohortrun tests, driven by flags. It first prints
// "pid <P>" on stdout (so a test can check afterwards that the process is gone), then does, in
// this order, what its flags ask:
//   --outlive-peers         first wait (up to 20 s) until every other rank recorded in the job's roster
//                           (ipc/rank_roster.h: cohortrun records every worker) has exited (only
//                           on --rank R when given)
//   --join-roster           join the job's roster as its rank, as a train::Job does (the worker then
//                           counts as one that uses the Cohort runtime)
//   --finish                leave the roster finished just before exiting, as a Job that ends normally
//   --print-signals         print "signal <NAME>: default|ignored|handled, blocked|unblocked" for
//                           SIGHUP, SIGINT, SIGTERM, SIGUSR1 and SIGPIPE, as they were at exec
//   --print-env             print "env NAME=value" for the launcher's variables
//   --create-segment        create the file segmentPath($COHORT_JOB_ID, "test-<rank>")
//                           and print "segment <path>"
//   --await-peers           wait (up to 20 s) until every rank's segment exists: then every rank
//                           has printed its pid and environment
//   --print N               print N lines on stdout and N on stderr, naming the stream
//   --long-line BYTES       print one line of BYTES 'x' characters on stdout
//   --progress N            N times: a progress line "step i of N" (kProgressMarker first, as
//                           train/observe/progress.h writes under cohortrun on a terminal), then
//                           "work i of rank <k>" on stdout and "note i of rank <k>" on stderr
//   --report-signal         on SIGTERM print "rank <k> got SIGTERM" and exit 143; on SIGUSR1 print
//                           "rank <k> got SIGUSR1" and go on
//   --ignore-sigterm        ignore SIGTERM
//   --steps S               print "step i" for i < S; with --exit-code C --at-step I (and
//                           --rank R: only that rank) exit with C at step I
//   --signal-self SIG       raise SIG (only on --rank R when given)
//   --fail-first-attempt    exit with --exit-code (default 3) when COHORT_RESTART_COUNT is 0
//                           (only on --rank R when given)
//   --hang                  sleep in short naps until killed
//   --await-file PATH       after the steps, wait (up to 60 s) until PATH exists, printing
//                           "waiting for PATH" first
//   --device D              ignored: gives cohortrun a worker command that names a GPU
//   --record FILE           append "worker <k> start CUDA_MPS_PIPE_DIRECTORY=… CUDA_MPS_LOG_DIRECTORY=…"
//                           to FILE first and "worker <k> end <exit code>" last (one write each,
//                           O_APPEND), so that a test can order them with other processes' lines
// Exits 0 otherwise. Not a Cohort API: only the tests use it.
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <CLI/CLI.hpp>  // CLI11
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ipc/process_liveness.h"
#include "ipc/rank_roster.h"
#include "ipc/shm_names.h"
#include "launcher/output_pump.h"  // kProgressMarker

namespace {

struct Flags {
  int rank = -1;  // -1: every rank
  bool createSegment = false;
  bool awaitPeers = false;
  bool printSignals = false;
  bool printEnv = false;
  int print = 0;
  int longLine = 0;
  int progress = 0;
  bool reportSignal = false;
  bool ignoreSigterm = false;
  int steps = 0;
  int exitCode = 3;
  int atStep = -1;
  int signalSelf = 0;
  bool failFirstAttempt = false;
  bool hang = false;
  std::string awaitFile;
  std::string device;
  std::string record;
  bool outlivePeers = false;
  bool joinRoster = false;
  bool finish = false;
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "<unset>";
}

int myRank() { return std::atoi(env("RANK").c_str()); }

// Written before the handlers are installed; the handlers only read them.
char gSigtermMessage[64];
char gSigusr1Message[64];

void onSigterm(int) {
  (void)!::write(1, gSigtermMessage, std::strlen(gSigtermMessage));
  ::_exit(143);
}

void onSigusr1(int) { (void)!::write(1, gSigusr1Message, std::strlen(gSigusr1Message)); }

// One line appended to `path` with one write(), so lines of several processes never interleave.
void record(const std::string& path, const std::string& line) {
  if (path.empty()) return;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return;
  const std::string text = line + "\n";
  (void)!::write(fd, text.data(), text.size());
  ::close(fd);
}

void say(const std::string& line, FILE* stream = stdout) {
  std::fprintf(stream, "%s\n", line.c_str());
  std::fflush(stream);
}

// What the launcher handed over through exec: read before this program installs any handler.
std::vector<std::string> signalStates() {
  sigset_t blocked;
  sigprocmask(SIG_BLOCK, nullptr, &blocked);
  std::vector<std::string> lines;
  for (int sig : {SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGPIPE}) {
    struct sigaction action {};
    sigaction(sig, nullptr, &action);
    const char* disposition = action.sa_handler == SIG_DFL   ? "default"
                              : action.sa_handler == SIG_IGN ? "ignored"
                                                             : "handled";
    lines.push_back(std::string("signal SIG") + sigabbrev_np(sig) + ": " + disposition + ", " +
                    (sigismember(&blocked, sig) ? "blocked" : "unblocked"));
  }
  return lines;
}

std::string segmentPath(int rank) {
  return cohort::ipc::segmentPath(env("COHORT_JOB_ID"), "test-" + std::to_string(rank));
}

// The line is said before the file appears under its name (made aside, then renamed): a peer that
// sees the file (awaitPeers) and fails can get this worker stopped, and the line must be out by then.
void createSegment() {
  const std::string path = segmentPath(myRank());
  const std::string aside = path + ".new";
  int fd = ::open(aside.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    say("cannot create " + aside, stderr);
    std::exit(1);
  }
  ::close(fd);
  say("segment " + path);
  if (::rename(aside.c_str(), path.c_str()) != 0) {
    say("cannot rename " + aside + " to " + path, stderr);
    std::exit(1);
  }
}

// A file-system barrier: polls for every rank's segment file.
void awaitPeers() {
  const int worldSize = std::atoi(env("WORLD_SIZE").c_str());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int rank = 0; rank < worldSize; ++rank) {
    while (::access(segmentPath(rank).c_str(), F_OK) != 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        say("timed out waiting for the segment of rank " + std::to_string(rank), stderr);
        std::exit(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

// Polls the roster until no other rank's process is alive (or was never recorded).
void outlivePeers(int rank) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    bool othersRun = false;
    for (const cohort::ipc::RosterEntry& e : cohort::ipc::RankRoster::peek(env("COHORT_JOB_ID"))) {
      othersRun |= e.localRank != rank && (e.pid == 0 || cohort::ipc::processIsAlive(e.pid, 0));
    }
    if (!othersRun) return;
    if (std::chrono::steady_clock::now() > deadline) {
      say("timed out waiting for the other ranks to exit", stderr);
      std::exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void awaitFile(const std::string& path) {
  say("waiting for " + path);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (::access(path.c_str(), F_OK) != 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      say("timed out waiting for " + path, stderr);
      std::exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::optional<cohort::ipc::RankRoster> joinRoster(int rank) {
  return cohort::ipc::RankRoster::join({.jobId = env("COHORT_JOB_ID"),
                                         .rank = rank,
                                         .localRank = std::atoi(env("LOCAL_RANK").c_str()),
                                         .localWorldSize = std::atoi(env("LOCAL_WORLD_SIZE").c_str()),
                                         .jobIdSource = "COHORT_JOB_ID=" + env("COHORT_JOB_ID")});
}

int runSteps(const Flags& f, bool thisRank) {
  for (int step = 0; step < f.steps; ++step) {
    if (thisRank && step == f.atStep) return f.exitCode;
    say("step " + std::to_string(step));
  }
  return 0;
}

// What the flags ask for after the pid and the environment; returns the exit code.
int work(const Flags& f, int rank, bool thisRank) {
  if (f.createSegment) createSegment();
  if (f.awaitPeers) awaitPeers();
  for (int i = 0; i < f.print; ++i) {
    say("stdout line " + std::to_string(i) + " of rank " + std::to_string(rank));
    say("stderr line " + std::to_string(i) + " of rank " + std::to_string(rank), stderr);
  }
  if (f.longLine > 0) say(std::string(static_cast<size_t>(f.longLine), 'x'));
  for (int i = 0; i < f.progress; ++i) {
    const std::string of = std::to_string(i) + " of ";
    say(std::string(cohort::launcher::kProgressMarker) + "step " + of + std::to_string(f.progress));
    say("work " + of + "rank " + std::to_string(rank));
    say("note " + of + "rank " + std::to_string(rank), stderr);
  }
  if (int code = runSteps(f, thisRank)) return code;
  if (f.signalSelf != 0 && thisRank) ::raise(f.signalSelf);
  if (f.failFirstAttempt && thisRank && env("COHORT_RESTART_COUNT") == "0") {
    say("failing on purpose in the first attempt");
    return f.exitCode;
  }
  if (!f.awaitFile.empty()) awaitFile(f.awaitFile);
  while (f.hang) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> signalsAtExec = signalStates();
  CLI::App app{"test worker for cohortrun"};
  Flags f;
  app.add_option("--rank", f.rank);
  app.add_flag("--create-segment", f.createSegment);
  app.add_flag("--await-peers", f.awaitPeers);
  app.add_flag("--print-signals", f.printSignals);
  app.add_flag("--print-env", f.printEnv);
  app.add_option("--print", f.print);
  app.add_option("--long-line", f.longLine);
  app.add_option("--progress", f.progress);
  app.add_flag("--report-signal", f.reportSignal);
  app.add_flag("--ignore-sigterm", f.ignoreSigterm);
  app.add_option("--steps", f.steps);
  app.add_option("--exit-code", f.exitCode);
  app.add_option("--at-step", f.atStep);
  app.add_option("--signal-self", f.signalSelf);
  app.add_flag("--fail-first-attempt", f.failFirstAttempt);
  app.add_flag("--hang", f.hang);
  app.add_option("--await-file", f.awaitFile);
  app.add_option("--device", f.device);
  app.add_option("--record", f.record);
  app.add_flag("--outlive-peers", f.outlivePeers);
  app.add_flag("--join-roster", f.joinRoster);
  app.add_flag("--finish", f.finish);
  CLI11_PARSE(app, argc, argv);

  const int rank = myRank();
  const bool thisRank = f.rank < 0 || f.rank == rank;
  std::snprintf(gSigtermMessage, sizeof gSigtermMessage, "rank %d got SIGTERM\n", rank);
  std::snprintf(gSigusr1Message, sizeof gSigusr1Message, "rank %d got SIGUSR1\n", rank);
  if (f.reportSignal) {
    ::signal(SIGTERM, onSigterm);
    ::signal(SIGUSR1, onSigusr1);
  }
  if (f.ignoreSigterm) ::signal(SIGTERM, SIG_IGN);
  record(f.record, "worker " + std::to_string(rank) + " start CUDA_MPS_PIPE_DIRECTORY=" +
                       env("CUDA_MPS_PIPE_DIRECTORY") + " CUDA_MPS_LOG_DIRECTORY=" + env("CUDA_MPS_LOG_DIRECTORY"));
  say("pid " + std::to_string(::getpid()));
  if (f.printSignals) {
    for (const std::string& line : signalsAtExec) say(line);
  }
  if (f.printEnv) {
    for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "COHORT_JOB_ID",
                             "COHORT_RESTART_COUNT", "OMP_NUM_THREADS", "COHORT_PROGRESS"}) {
      say(std::string("env ") + name + "=" + env(name));
    }
  }
  if (f.outlivePeers && thisRank) outlivePeers(rank);
  std::optional<cohort::ipc::RankRoster> roster;
  if (f.joinRoster) roster = joinRoster(rank);
  const int code = work(f, rank, thisRank);
  if (roster && f.finish) roster->leave(true);
  record(f.record, "worker " + std::to_string(rank) + " end " + std::to_string(code));
  return code;
}
