#include "launcher/launch_plan.h"

#include <sched.h>
#include <unistd.h>

#include <CLI/CLI.hpp>  // CLI11
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "launcher/mps_daemon.h"  // isMpsVariable
#include "launcher/mps_probe.h"   // environmentValue
#include "runtime/error.h"

extern char** environ;

namespace cohort::launcher {
namespace {

// Set per worker by environmentFor(); an inherited value (a nested launcher, a stale shell) must not
// leak through.
const char* const kPerWorkerVariables[] = {"RANK",          "LOCAL_RANK",          "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                           "COHORT_JOB_ID", "COHORT_RESTART_COUNT"};

std::string variableName(const std::string& entry) { return entry.substr(0, entry.find('=')); }

bool isPerWorkerVariable(const std::string& entry) {
  const std::string name = variableName(entry);
  for (const char* v : kPerWorkerVariables) {
    if (name == v) return true;
  }
  return false;
}

// The user's choice of progress output, which the launcher respects; other values of
// COHORT_PROGRESS are the launcher's own to set (LaunchPlan::liveStatus).
bool isUserProgressChoice(const std::string& entry) {
  return entry == "COHORT_PROGRESS=plain" || entry == "COHORT_PROGRESS=off";
}

// `arg` as a shell reads it back: quoted only when it has to be.
std::string shellQuoted(const std::string& arg) {
  const bool plain = !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_-+=.,:/@%", c) != nullptr;
  });
  if (plain) return arg;
  std::string quoted = "'";
  for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// The longest grace period (and --mps-timeout) accepted: a day, so that milliseconds never overflow.
constexpr double kMaxGracePeriodS = 86400.0;
constexpr int kMaxWorkers = 4096;

}  // namespace

void addLaunchFlags(CLI::App& app, LaunchFlags& flags) {
  // The underscore spellings are torchrun's; both are accepted.
  app.add_option("--nproc-per-node,--nproc_per_node", flags.nprocPerNode, "worker processes to start (N >= 1)")
      ->required();
  app.add_option("--max-restarts,--max_restarts", flags.maxRestarts,
                 "restart the whole group up to R times after a worker fails (default 0)");
  app.add_option("--log-dir,--log_dir", flags.logDir, "also write DIR/rank<k>.log per worker (created if missing)");
  app.add_option("--grace-period", flags.gracePeriodS,
                 "seconds the workers get to exit after SIGTERM/SIGINT before SIGKILL (default 5)");
  app.add_option("--bind", flags.bind,
                 "auto | cores | none: bind each worker to its own block of CPUs (auto: when there are at least "
                 "as many CPUs as workers)")
      ->capture_default_str();
  app.add_flag("--mps", flags.mps,
               "start a private NVIDIA MPS control daemon for the job, so that workers sharing a GPU run side by side");
  app.add_option("--mps-timeout", flags.mpsTimeoutS,
                 "seconds each wait on the --mps daemon may take: coming up, quitting (default 10)");
  app.add_option("command", flags.command, "PROGRAM ARGS…: the worker program (after --)");
  app.positionals_at_end();
}

void checkSeparator(const std::vector<std::string>& args, const LaunchFlags& flags) {
  const std::vector<std::string>& command = flags.command;
  if (command.empty() || command.size() > args.size()) return;
  const size_t program = args.size() - command.size();  // positionals at the end: the command is the tail
  if (program > 0 && args[program - 1] == "--") return;
  auto flag = std::find_if(command.begin() + 1, command.end(),
                           [](const std::string& arg) { return arg.size() > 1 && arg[0] == '-'; });
  if (flag == command.end()) return;  // nothing of the worker's could be misread
  std::string fixed = "cohortrun";
  for (size_t i = 0; i < args.size(); ++i) fixed += (i == program ? " -- " : " ") + shellQuoted(args[i]);
  COHORT_THROW(InvalidArgument) << "put -- before the worker program so that its flags (" << *flag
                                << ") are not read as cohortrun's: " << fixed;
}

LaunchPlan makeLaunchPlan(const LaunchFlags& flags, const PlanInputs& inputs) {
  if (flags.nprocPerNode < 1 || flags.nprocPerNode > kMaxWorkers) {
    COHORT_THROW(InvalidArgument) << "--nproc-per-node must be between 1 and " << kMaxWorkers << ", got "
                                  << flags.nprocPerNode;
  }
  if (flags.maxRestarts < 0) COHORT_THROW(InvalidArgument) << "--max-restarts must be >= 0, got " << flags.maxRestarts;
  if (!(flags.gracePeriodS > 0) || flags.gracePeriodS > kMaxGracePeriodS) {
    COHORT_THROW(InvalidArgument) << "--grace-period must be > 0 and at most " << kMaxGracePeriodS << " seconds, got "
                                  << flags.gracePeriodS;
  }
  if (!(flags.mpsTimeoutS > 0) || flags.mpsTimeoutS > kMaxGracePeriodS) {
    COHORT_THROW(InvalidArgument) << "--mps-timeout must be > 0 and at most " << kMaxGracePeriodS << " seconds, got "
                                  << flags.mpsTimeoutS;
  }
  if (flags.command.empty() || flags.command[0].empty()) {
    COHORT_THROW(InvalidArgument) << "missing PROGRAM: usage: cohortrun --nproc-per-node N [flags] -- PROGRAM ARGS…";
  }
  LaunchPlan plan;
  plan.worldSize = flags.nprocPerNode;
  plan.maxRestarts = flags.maxRestarts;
  plan.logDir = flags.logDir;
  plan.gracePeriod = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(flags.gracePeriodS * 1000.0)));
  plan.command = flags.command;
  plan.jobId = inputs.jobId;
  plan.mps = flags.mps;
  plan.mpsTimeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(flags.mpsTimeoutS * 1000.0)));
  const std::string tmp = environmentValue(inputs.environment, "TMPDIR").value_or("");
  plan.jobDirectory = (tmp.empty() ? std::string("/tmp") : tmp) + "/cohortrun-" + inputs.jobId;
  plan.mpsNote = inputs.mpsNote;
  // Binding: worker k gets CPUs [k·c, (k+1)·c) of the allowed ones, c = allowed / N. Without it the
  // scheduler moves workers (and their data-loader and communication threads) between cores and
  // their caches go cold: all-reduce training ran about 30% faster bound on a 2-core machine.
  if (flags.bind != "auto" && flags.bind != "cores" && flags.bind != "none") {
    COHORT_THROW(InvalidArgument) << "--bind must be auto, cores or none, got '" << flags.bind << "'";
  }
  const size_t cpus = inputs.allowedCpus.size();
  const size_t n = static_cast<size_t>(flags.nprocPerNode);
  if (flags.bind == "cores" && cpus < n) {
    COHORT_THROW(InvalidArgument) << "--bind cores needs a CPU per worker, but only " << cpus << " are allowed for "
                                  << n << " workers";
  }
  if (flags.bind != "none" && cpus >= n) {
    const size_t per = cpus / n;
    for (size_t k = 0; k < n; ++k) {
      plan.cpusOfRank.emplace_back(inputs.allowedCpus.begin() + static_cast<std::ptrdiff_t>(k * per),
                                   inputs.allowedCpus.begin() + static_cast<std::ptrdiff_t>((k + 1) * per));
    }
  }
  plan.liveStatus = inputs.stdoutIsTerminal;
  bool progressChosen = false;
  for (const std::string& entry : inputs.environment) {
    if (isPerWorkerVariable(entry)) continue;
    if (flags.mps && isMpsVariable(entry)) continue;  // the job's own daemon's are set instead
    if (variableName(entry) == "COHORT_PROGRESS") {
      if (!isUserProgressChoice(entry)) continue;
      progressChosen = true;
    }
    plan.baseEnvironment.push_back(entry);
  }
  // Rank 0 then sends its progress as marker lines, which the pump shows as the status line.
  if (plan.liveStatus && !progressChosen) plan.baseEnvironment.push_back("COHORT_PROGRESS=live");
  return plan;
}

bool stdoutIsTerminal() {
  if (::isatty(1) != 1) return false;
  const char* term = std::getenv("TERM");
  return term == nullptr || std::strcmp(term, "dumb") != 0;
}

std::vector<int> allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

std::vector<std::string> LaunchPlan::environmentFor(int rank, int restartCount) const {
  std::vector<std::string> env = baseEnvironment;
  bool ompSet = false;
  for (const std::string& entry : env) ompSet = ompSet || variableName(entry) == "OMP_NUM_THREADS";
  // One BLAS/OpenMP thread per worker unless the user chose otherwise (docs/architecture.md, "Performance principles").
  if (!ompSet) env.push_back("OMP_NUM_THREADS=1");
  env.push_back("RANK=" + std::to_string(rank));
  env.push_back("LOCAL_RANK=" + std::to_string(rank));  // single node
  env.push_back("WORLD_SIZE=" + std::to_string(worldSize));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(worldSize));
  env.push_back("COHORT_JOB_ID=" + jobId);
  env.push_back("COHORT_RESTART_COUNT=" + std::to_string(restartCount));
  return env;
}

std::vector<std::string> currentEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

}  // namespace cohort::launcher
