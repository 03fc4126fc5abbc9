#include "runtime/world_info.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "runtime/error.h"

namespace cohort::runtime {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int parseInt(const char* name, const char* text) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < 0 || v > (1 << 30)) {
    COHORT_THROW(InvalidArgument) << "environment variable " << name << "='" << text
                                  << "' is not a non-negative integer";
  }
  return static_cast<int>(v);
}

int intOr(const char* name, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  if (std::string(name) == "SLURM_TASKS_PER_NODE") {
    std::string digits;
    for (const char* p = v; *p >= '0' && *p <= '9'; ++p) digits += *p;
    return parseInt(name, digits.empty() ? v : digits.c_str());
  }
  return parseInt(name, v);
}

struct Scheme {
  const char* source;
  const char* rank;
  const char* size;
  const char* localRank;
  const char* localSize;
  const char* jobId;
};

constexpr Scheme kSchemes[] = {
    {"cohortrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "COHORT_JOB_ID"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid"},
    // SLURM_TASKS_PER_NODE reads like "4(x2)" or "4,3": its leading count is this node's when the
    // nodes are uniform, which the launchers we support assume.
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE", "SLURM_JOB_ID"},
    {"pmi", "PMI_RANK", "PMI_SIZE", nullptr, nullptr, nullptr},
};

}  // namespace

WorldInfo WorldInfo::detect() {
  WorldInfo w;
  w.restartCount = intOr("COHORT_RESTART_COUNT", 0);
  for (const Scheme& s : kSchemes) {
    if (!env(s.rank) || !env(s.size)) continue;
    w.source = s.source;
    // RANK/WORLD_SIZE without COHORT_JOB_ID: another launcher with torchrun's variables.
    if (w.source == std::string("cohortrun") && !env("COHORT_JOB_ID")) w.source = "env";
    w.rank = parseInt(s.rank, env(s.rank));
    w.worldSize = parseInt(s.size, env(s.size));
    // Without local information a launcher is assumed to have put every rank on this node.
    w.localRank = s.localRank ? intOr(s.localRank, w.rank) : w.rank;
    w.localWorldSize = s.localSize ? intOr(s.localSize, w.worldSize) : w.worldSize;
    if (s.jobId && env(s.jobId)) {
      w.jobId = env(s.jobId);
    } else {
      // Ranks of one job share the parent's pid only under a common launcher; good enough for
      // single-node fallbacks and documented as such.
      w.jobId = std::string(s.source) + "-" + std::to_string(getppid());
    }
    if (w.source == std::string("slurm")) {
      // Two srun steps of one job may run at once, each its own world; a requeued job keeps its id
      // and SLURM_RESTART_COUNT tells its runs apart (the generation of its segments).
      if (const char* step = env("SLURM_STEP_ID")) w.jobId += std::string("-") + step;
      if (!env("COHORT_RESTART_COUNT")) w.restartCount = intOr("SLURM_RESTART_COUNT", 0);
    }
    if (w.worldSize < 1 || w.rank >= w.worldSize || w.localRank >= w.localWorldSize) {
      COHORT_THROW(InvalidArgument) << "inconsistent " << s.source << " environment: rank " << w.rank
                                    << ", world size " << w.worldSize << ", local rank "
                                    << w.localRank << ", local world size " << w.localWorldSize;
    }
    return w;
  }
  return w;
}

std::string rankForMessages() {
  try {
    return std::to_string(WorldInfo::detect().rank);
  } catch (...) {
    return "?";
  }
}

}  // namespace cohort::runtime
