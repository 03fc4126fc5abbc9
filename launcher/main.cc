// cohortrun: starts N worker processes on this node and supervises them (docs/launcher.md).
//   cohortrun --nproc-per-node N [--max-restarts R] [--log-dir DIR] [--grace-period S]
//             [--bind auto|cores|none] [--mps [--mps-timeout S]] -- PROGRAM ARGS…
// The one place in launcher/ where errors become exit codes (docs/errors.md). Never links CUDA,
// NCCL or MPI (docs/architecture.md, "Layers"): workers are started with fork+exec.
#include <signal.h>

#include <CLI/CLI.hpp>  // CLI11: flags
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "ipc/shm_names.h"              // makeLauncherJobId
#include "launcher/descriptor_limit.h"  // ulimit -n against what N workers need
#include "launcher/launch_plan.h"       // flags -> plan
#include "launcher/mps_probe.h"         // the note on workers sharing a GPU without MPS
#include "launcher/supervisor.h"        // spawn, supervise, restart, clean up
#include "runtime/error.h"              // exit codes

namespace {

int run(int argc, char** argv) {
  using namespace cohort;
  CLI::App app{"cohortrun: start and supervise N Cohort worker processes on this node"};
  app.footer(
      "usage: cohortrun --nproc-per-node N [--max-restarts R] [--log-dir DIR] [--grace-period S] "
      "[--bind auto|cores|none] [--mps [--mps-timeout S]] -- PROGRAM ARGS...");
  launcher::LaunchFlags flags;
  launcher::addLaunchFlags(app, flags);
  std::string parseError;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help: usage on stdout, exit 0
    parseError = e.what();
  }
  // First: CLI11's "--mode was not expected" is how a forgotten `--` usually shows.
  launcher::checkSeparator(std::vector<std::string>(argv + 1, argv + argc), flags);
  if (!parseError.empty()) throw InvalidArgument(parseError + " (run with --help for usage)");
  const std::vector<std::string> environment = launcher::currentEnvironment();
  const std::string mpsNote = launcher::mpsNote({.workers = flags.nprocPerNode,
                                                 .command = flags.command,
                                                 .environment = environment,
                                                 .gpusDirectory = launcher::nvidiaGpusDirectory(environment),
                                                 .mpsRequested = flags.mps});
  launcher::LaunchPlan plan =
      launcher::makeLaunchPlan(flags, launcher::PlanInputs{.jobId = ipc::makeLauncherJobId(),
                                                           .environment = environment,
                                                           .allowedCpus = launcher::allowedCpus(),
                                                           .stdoutIsTerminal = launcher::stdoutIsTerminal(),
                                                           .mpsNote = mpsNote});
  launcher::ensureDescriptors({.workers = plan.worldSize, .logFiles = !plan.logDir.empty()});
  // A closed stdout (cohortrun ... | head) must not kill the launcher while workers still run.
  ::signal(SIGPIPE, SIG_IGN);
  launcher::Supervisor supervisor(plan);
  return supervisor.run();
}

}  // namespace

int main(int argc, char** argv) { return cohort::runMain("cohortrun: ", [&] { return run(argc, argv); }); }
