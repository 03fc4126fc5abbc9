// WorldInfo: who this process is in the job (rank, world size, local rank, job id).
//
// detect() reads the environment, in this order (docs/launcher.md; docs/architecture.md,
// "Processes"): cohortrun's RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / COHORT_JOB_ID; Open
// MPI's OMPI_COMM_WORLD_*; SLURM's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_JOB_ID, with
// the local world size this node's entry (SLURM_NODEID) of SLURM_STEP_TASKS_PER_NODE or
// SLURM_TASKS_PER_NODE ("2(x3),1": nodes may differ); PMI_RANK / PMI_SIZE; else a single process.
// Inconsistent values (rank >= world size, non-numbers, a node index past the list) throw
// InvalidArgument.
// A value type; pass it explicitly (no global).
#pragma once

#include <string>

namespace cohort::runtime {

struct WorldInfo {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;
  int localWorldSize = 1;
  std::string jobId = "local";
  int restartCount = 0;  // COHORT_RESTART_COUNT: how often cohortrun has restarted the group
  // Whose variables were used: "cohortrun" (RANK... with COHORT_JOB_ID), "env" (RANK... without it,
  // e.g. torchrun), "openmpi", "slurm", "pmi" or "single".
  std::string source = "single";

  bool isSingle() const { return worldSize == 1; }
  bool spansNodes() const { return localWorldSize < worldSize; }

  static WorldInfo detect();
};

// The rank for a message printed where no WorldInfo is at hand (a failed CHECK): detect()'s rank,
// or "?" when the environment is inconsistent. Never throws.
std::string rankForMessages();

}  // namespace cohort::runtime
