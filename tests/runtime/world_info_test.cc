#include "runtime/world_info.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "runtime/error.h"

namespace cohort::runtime {
namespace {

const char* kAllVars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "COHORT_JOB_ID",
                          "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                          "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID",
                          "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT", "COHORT_RESTART_COUNT",
                          "PMI_RANK", "PMI_SIZE"};

class WorldInfoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kAllVars) unsetenv(v);
  }
};

TEST_F(WorldInfoTest, SingleProcessByDefault) {
  WorldInfo w = WorldInfo::detect();
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.worldSize, 1);
  EXPECT_EQ(w.source, "single");
}

TEST_F(WorldInfoTest, CohortrunVariablesWinOverMpi) {
  setenv("RANK", "2", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("LOCAL_RANK", "0", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  setenv("COHORT_JOB_ID", "job7", 1);
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  WorldInfo w = WorldInfo::detect();
  EXPECT_EQ(w.rank, 2);
  EXPECT_EQ(w.worldSize, 4);
  EXPECT_EQ(w.localRank, 0);
  EXPECT_TRUE(w.spansNodes());
  EXPECT_EQ(w.jobId, "job7");
  EXPECT_EQ(w.source, "cohortrun");
}

TEST_F(WorldInfoTest, OpenMpiThenSlurmThenPmi) {
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_JOB_ID", "991", 1);
  WorldInfo w = WorldInfo::detect();
  EXPECT_EQ(w.source, "slurm");
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.jobId, "991");
  EXPECT_EQ(w.restartCount, 0);
  // Each srun step is its own world; a requeued job's run count is its restart count.
  setenv("SLURM_STEP_ID", "2", 1);
  setenv("SLURM_RESTART_COUNT", "3", 1);
  w = WorldInfo::detect();
  EXPECT_EQ(w.jobId, "991-2");
  EXPECT_EQ(w.restartCount, 3);
  unsetenv("SLURM_STEP_ID");
  unsetenv("SLURM_RESTART_COUNT");
  setenv("OMPI_COMM_WORLD_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  EXPECT_EQ(WorldInfo::detect().source, "openmpi");
  for (const char* v : kAllVars) unsetenv(v);
  setenv("PMI_RANK", "0", 1);
  setenv("PMI_SIZE", "2", 1);
  EXPECT_EQ(WorldInfo::detect().source, "pmi");
}

TEST_F(WorldInfoTest, TorchrunStyleVariablesWithoutAJobIdAreSourceEnv) {
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  WorldInfo w = WorldInfo::detect();
  EXPECT_EQ(w.source, "env");
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.localWorldSize, 2);
}

TEST_F(WorldInfoTest, SlurmTasksPerNodeWithRepeatCount) {
  setenv("SLURM_PROCID", "5", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_TASKS_PER_NODE", "4(x2)", 1);
  WorldInfo w = WorldInfo::detect();
  EXPECT_EQ(w.localWorldSize, 4);
  EXPECT_TRUE(w.spansNodes());
}

// sbatch -N2 -n3 runs 2 tasks on the first node and 1 on the second: SLURM_TASKS_PER_NODE "2,1" (or
// compressed "2(x1),1"), and each node's tasks must see their own node's count, not the first's.
TEST_F(WorldInfoTest, SlurmNodesWithDifferentTaskCountsEachSeeTheirOwn) {
  setenv("SLURM_NTASKS", "5", 1);
  setenv("SLURM_JOB_ID", "7", 1);
  struct Task {
    const char* procid;
    const char* localid;
    const char* nodeid;
    int localWorldSize;
  };
  for (const char* tasksPerNode : {"2,1,2", "2(x1),1,2", "2(x1),1(x1),2(x1)"}) {
    setenv("SLURM_TASKS_PER_NODE", tasksPerNode, 1);
    for (const Task& t : {Task{"0", "0", "0", 2}, Task{"1", "1", "0", 2}, Task{"2", "0", "1", 1},
                          Task{"3", "0", "2", 2}, Task{"4", "1", "2", 2}}) {
      setenv("SLURM_PROCID", t.procid, 1);
      setenv("SLURM_LOCALID", t.localid, 1);
      setenv("SLURM_NODEID", t.nodeid, 1);
      WorldInfo w = WorldInfo::detect();
      EXPECT_EQ(w.localWorldSize, t.localWorldSize) << tasksPerNode << ", rank " << t.procid;
      EXPECT_TRUE(w.spansNodes());
    }
  }
  // srun's own step layout wins over the allocation's.
  setenv("SLURM_TASKS_PER_NODE", "4(x2)", 1);
  setenv("SLURM_STEP_TASKS_PER_NODE", "3,1(x2)", 1);
  setenv("SLURM_NODEID", "2", 1);
  setenv("SLURM_LOCALID", "0", 1);
  EXPECT_EQ(WorldInfo::detect().localWorldSize, 1);
  setenv("SLURM_NODEID", "0", 1);
  EXPECT_EQ(WorldInfo::detect().localWorldSize, 3);
}

TEST_F(WorldInfoTest, SlurmTasksPerNodeThatCannotBeReadIsRefusedNamingIt) {
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "3", 1);
  setenv("SLURM_LOCALID", "0", 1);
  auto message = [] {
    try {
      WorldInfo::detect();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  for (const char* bad : {"2(x", "2(x0),1", "2(y1)", "2,", ",1", "a", "2(x1)1"}) {
    setenv("SLURM_TASKS_PER_NODE", bad, 1);
    setenv("SLURM_NODEID", "0", 1);
    EXPECT_NE(message().find(std::string("SLURM_TASKS_PER_NODE='") + bad + "'"), std::string::npos) << message();
  }
  // Unequal nodes need to know which node this is; a node index past the list is refused.
  setenv("SLURM_TASKS_PER_NODE", "2,1", 1);
  unsetenv("SLURM_NODEID");
  EXPECT_NE(message().find("SLURM_NODEID"), std::string::npos) << message();
  setenv("SLURM_NODEID", "2", 1);
  EXPECT_NE(message().find("SLURM_NODEID=2"), std::string::npos) << message();
  // Equal nodes do without it.
  setenv("SLURM_TASKS_PER_NODE", "2(x2)", 1);
  unsetenv("SLURM_NODEID");
  EXPECT_EQ(WorldInfo::detect().localWorldSize, 2);
}

TEST_F(WorldInfoTest, InconsistentValuesAreRefused) {
  setenv("RANK", "4", 1);
  setenv("WORLD_SIZE", "4", 1);
  EXPECT_THROW(WorldInfo::detect(), InvalidArgument);
  setenv("RANK", "x", 1);
  EXPECT_THROW(WorldInfo::detect(), InvalidArgument);
  EXPECT_EQ(rankForMessages(), "?");
}

}  // namespace
}  // namespace cohort::runtime
