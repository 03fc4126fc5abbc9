#include "runtime/world_info.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

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
  return v ? parseInt(name, v) : fallback;
}

// SLURM's tasks per node, one count per node of the step in node order, with runs compressed:
// "2(x3),1" is 2,2,2,1 (srun sets SLURM_STEP_TASKS_PER_NODE for its step, and SLURM_TASKS_PER_NODE,
// which is the allocation's in a batch script). Throws InvalidArgument naming the variable.
std::vector<int> parseTasksPerNode(const char* name, const std::string& text) {
  std::vector<int> counts;
  auto bad = [&] {
    COHORT_THROW(InvalidArgument) << "environment variable " << name << "='" << text
                                  << "' is not a list of task counts like '2(x3),1'";
  };
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string entry = text.substr(at, end - at);
    const size_t open = entry.find("(x");
    const std::string count = entry.substr(0, open);
    int repeat = 1;
    if (open != std::string::npos) {
      if (entry.back() != ')') bad();
      const std::string times = entry.substr(open + 2, entry.size() - open - 3);
      if (times.empty() || times.find_first_not_of("0123456789") != std::string::npos) bad();
      repeat = parseInt(name, times.c_str());
    }
    if (count.empty() || count.find_first_not_of("0123456789") != std::string::npos || repeat < 1) bad();
    if (counts.size() + static_cast<size_t>(repeat) > (1u << 20)) bad();
    counts.insert(counts.end(), static_cast<size_t>(repeat), parseInt(name, count.c_str()));
    at = end + 1;
  }
  return counts;
}

// This node's task count under SLURM: the entry of SLURM_NODEID (the node's index in the step) in the
// step's tasks per node. Nodes may run different numbers of tasks (sbatch -N2 -n3: "2,1"), so the
// first count is this node's only where every count is the same. `fallback` without either variable.
int slurmLocalWorldSize(int fallback) {
  const char* name = env("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  const char* text = env(name);
  if (!text) return fallback;
  const std::vector<int> counts = parseTasksPerNode(name, text);
  const bool uniform = std::all_of(counts.begin(), counts.end(), [&](int c) { return c == counts[0]; });
  const char* node = env("SLURM_NODEID");
  if (!node) {
    if (uniform) return counts[0];
    COHORT_THROW(InvalidArgument) << "environment variable " << name << "='" << text
                                  << "' gives the nodes different task counts, but SLURM_NODEID (which node "
                                     "this is) is not set";
  }
  const int index = parseInt("SLURM_NODEID", node);
  if (index >= static_cast<int>(counts.size())) {
    COHORT_THROW(InvalidArgument) << "inconsistent slurm environment: SLURM_NODEID=" << index << " but " << name
                                  << "='" << text << "' lists " << counts.size() << " node(s)";
  }
  return counts[static_cast<size_t>(index)];
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
    // The local world size under SLURM is this node's entry of its tasks per node (slurmLocalWorldSize).
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, "SLURM_JOB_ID"},
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
      w.localWorldSize = slurmLocalWorldSize(w.worldSize);
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
