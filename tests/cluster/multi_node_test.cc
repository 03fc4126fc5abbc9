// Ranks on different (simulated) hosts train correctly (issue 19): 2 nodes x 2 workers in allreduce,
// over flat mpi and over the hierarchical backend (shm in each node, mpi between nodes) with replicas
// (the default) and with one shared parameter copy per node (--no-replicas), each node with its own hostname,
// network, /dev/shm and process tree, end with the parameters of one worker with the combined batch
// (1e-5 after 20 steps, resumed from a checkpoint after 12); every world line names its host. With
// one copy per node, a diverging job stops at the same step with the same verdict on every rank. The hierarchical
// all-reduce gives exact results for every op on sizes that do not split evenly over 2 and 3
// workers per node (its own check: cohort bench allreduce counts wrong elements); nodes with
// different worker counts fall back to flat mpi by default and are refused when hierarchical is
// asked for. Nothing is left in any node's /dev/shm (each node's is a tmpfs that goes with it, so
// the check is the cluster's own: `down` leaves no namespace or process behind).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "tests/cli/cli_test_support.h"
#include "tests/cluster/cluster_test.h"
#include "tests/support/process.h"

namespace cohort::testing {
namespace {

// The first layer's gradient (784 x 256 floats, 784 KiB) takes the hierarchical backend's staged,
// pipelined path; all-reduces up to 256 KiB go over MPI directly.
std::vector<std::string> trainArgs(int batch, const std::string& checkpoint, int steps = 20) {
  return {cohortBinary(), "train", "--data", "synthetic", "--model", "mlp:784,256,10", "--lr", "0.05", "--momentum", "0.9",
          "--seed", "5", "--threads", "1", "--batch-size", std::to_string(batch), "--max-steps", std::to_string(steps),
          "--checkpoint", checkpoint, "--progress-every", "0"};
}

class MultiNodeTest : public ClusterTest {
 protected:
  MultiNodeTest() : ClusterTest("cmn") {}
};

std::vector<std::string> mpirunAcross(const std::string& cluster, const std::string& hosts, int np) {
  return {cluster, "run", "2", "--rate", "1gbit", "--", "mpirun", "--allow-run-as-root", "--oversubscribe",
          "--bind-to", "none", "--host", hosts, "-np", std::to_string(np)};
}

// A backend, whether each worker keeps a replica (the default across nodes; hierarchical with
// --no-replicas keeps one shared copy per node), and a ZeRO stage and scope (0: none; docs/sharding.md).
struct Layout {
  std::string backend;
  bool replicas = true;
  int zero = 0;
  std::string zeroScope = "job";
};

class MultiNodeTraining : public MultiNodeTest, public ::testing::WithParamInterface<Layout> {};

TEST_P(MultiNodeTraining, TwoNodesOfTwoWorkersEqualOneWorkerWithTheCombinedBatch) {
  const auto& [backend, replicas, zero, zeroScope] = GetParam();
  const std::string many = dir_ + "/many.st", one = dir_ + "/one.st";
  // 12 steps, then the rest from the checkpoint: every node's copy (or replica) is loaded from it.
  auto across = [&](int steps, bool resume) {
    std::vector<std::string> argv = mpirunAcross(cluster_, "cohort-node0:2,cohort-node1:2", 4);
    for (const std::string& a : trainArgs(8, many, steps)) argv.push_back(a);
    for (const std::string& a : {std::string("--mode"), std::string("allreduce"), std::string("--backend"), backend}) argv.push_back(a);
    if (!replicas) argv.push_back("--no-replicas");
    if (zero > 0) {
      for (const std::string& a : {std::string("--zero"), std::to_string(zero), std::string("--zero-scope"), zeroScope})
        argv.push_back(a);
    }
    if (resume) argv.push_back("--resume");
    return runCommand(argv, {.timeout = std::chrono::seconds(240), .extraEnvironment = env_});
  };
  CommandResult first = across(12, false);
  ASSERT_EQ(first.exitCode, 0) << first.describe();
  CommandResult r = across(20, true);
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_NE(r.stdoutText.find("resumed"), std::string::npos) << r.stdoutText;
  EXPECT_EQ(r.stdoutText.find("one copy per node") != std::string::npos, !replicas) << r.stdoutText;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string host = "cohort-node" + std::to_string(rank / 2);
    EXPECT_NE(r.stdoutText.find("rank " + std::to_string(rank) + " of 4 (local " + std::to_string(rank % 2) + " of 2) on " + host),
              std::string::npos)
        << "rank " << rank << " on " << host << "\n" << r.stdoutText;
  }
  EXPECT_EQ(parseResultLine(r.stdoutText).fields["backend"], backend);

  CommandResult s = runCommand(trainArgs(32, one), {.timeout = std::chrono::seconds(240)});
  ASSERT_EQ(s.exitCode, 0) << s.describe();
  EXPECT_EQ(nn::readCheckpoint(many).metadata["step"], "20");
  EXPECT_EQ(expectSameParameters(one, many, 1e-5,
                                 "(2 nodes x 2 workers over " + backend + (replicas ? " with replicas" : "") +
                                     (zero > 0 ? ", ZeRO " + std::to_string(zero) + " scope " + zeroScope : "") + ")"),
            4);
  CommandResult status = runCommand({cluster_, "status"}, {.extraEnvironment = env_});
  EXPECT_NE(status.stdoutText.find(": down"), std::string::npos) << "the cluster is gone: " << status.describe();
}

INSTANTIATE_TEST_SUITE_P(Backends, MultiNodeTraining,
                         ::testing::Values(Layout{"mpi", true}, Layout{"hierarchical", false}, Layout{"hierarchical", true},
                                           Layout{"hierarchical", true, 2, "job"}, Layout{"hierarchical", true, 1, "node"}),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           const Layout& l = info.param;
                           return l.backend + (l.replicas ? "_replicas" : "_shared_per_node") +
                                  (l.zero > 0 ? "_zero" + std::to_string(l.zero) + "_" + l.zeroScope : "");
                         });

// Sizes 4 x 7^k bytes: 1, 7, 49, ... elements (odd: padded chunks), small ones over MPI directly,
// from 470596 bytes in stages, the largest in 5 pipelined segments with an uneven last one; every
// op, 2 and 3 workers per node. The benchmark checks every element and exits 1 on a wrong one.
TEST_F(MultiNodeTest, HierarchicalAllReduceIsExactForEveryOpAndUnevenSizes) {
  for (const auto& [hosts, np] : {std::pair<std::string, int>{"cohort-node0:2,cohort-node1:2", 4},
                                  std::pair<std::string, int>{"cohort-node0:3,cohort-node1:3", 6}}) {
    // One shell runs the four ops' mpiruns inside one cluster.
    std::string ops;
    for (const char* op : {"sum", "avg", "max", "min"}) {
      ops += std::string(ops.empty() ? "" : " && ") + "mpirun --allow-run-as-root --oversubscribe --bind-to none --host " +
             hosts + " -np " + std::to_string(np) + " " + cohortBinary() +
             " bench allreduce --backend hierarchical --min-bytes 4 --max-bytes 24M --step-factor 7 --iters 2 "
             "--warmup 1 --timeout 60 --op " + op;
    }
    CommandResult r = runCommand({cluster_, "run", "2", "--rate", "1gbit", "--", "bash", "-c", ops},
                                 {.timeout = std::chrono::seconds(300), .extraEnvironment = env_});
    ASSERT_EQ(r.exitCode, 0) << r.describe();
    EXPECT_NE(r.stdoutText.find("backend=hierarchical ranks=" + std::to_string(np)), std::string::npos) << r.stdoutText;
    size_t rows = 0;
    for (size_t at = 0; (at = r.stdoutText.find("RESULT bench=allreduce backend=hierarchical", at)) != std::string::npos; ++at) {
      ++rows;
      const size_t end = r.stdoutText.find('\n', at);
      EXPECT_NE(r.stdoutText.substr(at, end - at).find(" wrong=0 "), std::string::npos) << r.stdoutText.substr(at, end - at);
    }
    EXPECT_EQ(rows, 4u * 9u) << "4 ops x 9 sizes (4 B .. 23 MiB)\n" << r.stdoutText;
  }
}

// One copy per node: a step whose loss is non-finite on any rank is applied on no node, and every
// rank, on both nodes, stops at that step naming the same rank (exit 6, mpirun's too); the loss
// overflows before the gradient here (seed 5), so the verdict names the rank whose loss did.
TEST_F(MultiNodeTest, ADivergingJobStopsAtTheSameStepNamingTheSameRankOnEveryNode) {
  std::vector<std::string> argv = mpirunAcross(cluster_, "cohort-node0:2,cohort-node1:2", 4);
  for (const std::string& a : {cohortBinary(), std::string("train"), std::string("--data"), std::string("synthetic"),
                               std::string("--model"), std::string("mlp:784,64,10"), std::string("--lr"), std::string("1e6"),
                               std::string("--seed"), std::string("5"), std::string("--threads"), std::string("1"),
                               std::string("--batch-size"), std::string("32"), std::string("--progress-every"),
                               std::string("0"), std::string("--mode"), std::string("allreduce"), std::string("--no-replicas")}) {
    argv.push_back(a);
  }
  CommandResult r = runCommand(argv, {.timeout = std::chrono::seconds(240), .extraEnvironment = env_});
  EXPECT_EQ(r.exitCode, 6) << r.describe();
  const std::regex line(R"(\[rank (\d)\] cohort: error: step (\d+) \(epoch 1, batch \d+\): the (loss is non-finite on rank \d+|gradient is non-finite)[^\n]*training diverged)");
  std::set<std::string> ranks, verdicts;
  for (auto it = std::sregex_iterator(r.stderrText.begin(), r.stderrText.end(), line); it != std::sregex_iterator(); ++it) {
    ranks.insert((*it)[1]);
    verdicts.insert((*it)[2].str() + " " + (*it)[3].str());
  }
  EXPECT_EQ(ranks.size(), 4u) << "every rank says why it stopped\n" << r.describe();
  ASSERT_EQ(verdicts.size(), 1u) << "the ranks stopped at different steps or for different reasons\n" << r.describe();
  // The loss overflows first here (seed 5): the ranks of the other node learn of it from the flags.
  EXPECT_NE(verdicts.begin()->find("loss is non-finite on rank"), std::string::npos) << r.describe();
}

// 2 workers on one node and 1 on the other: no partner for local rank 1.
TEST_F(MultiNodeTest, UnevenNodesFallBackToFlatMpiOrAreRefusedByName) {
  const std::string hosts = "cohort-node0:2,cohort-node1:1";
  std::string runs;
  for (const char* backend : {"", "hierarchical"}) {
    runs += std::string(runs.empty() ? "" : "; echo ==; ") + "mpirun --allow-run-as-root --oversubscribe --bind-to none --host " +
            hosts + " -np 3 " + cohortBinary() +
            " train --data synthetic --model mlp:784,16,10 --max-steps 3 --threads 1 --progress-every 0 --mode allreduce" +
            (*backend ? std::string(" --backend ") + backend : std::string()) + " 2>&1; echo exit=$?";
  }
  CommandResult r = runCommand({cluster_, "run", "2", "--", "bash", "-c", runs},
                               {.timeout = std::chrono::seconds(240), .extraEnvironment = env_});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::string byDefault = r.stdoutText.substr(0, r.stdoutText.find("==")), asked = r.stdoutText.substr(r.stdoutText.find("=="));
  EXPECT_NE(byDefault.find("exit=0"), std::string::npos) << byDefault;
  EXPECT_NE(byDefault.find("RESULT mode=allreduce backend=mpi world_size=3"), std::string::npos) << byDefault;
  EXPECT_NE(asked.find("exit=2"), std::string::npos) << asked;
  EXPECT_NE(asked.find("the hierarchical backend needs the same number of workers on every node"), std::string::npos) << asked;
  EXPECT_NE(asked.find("use --backend mpi"), std::string::npos) << asked;
}

// SLURM's batch scripts (examples/slurm) under the cluster's real SLURM (`up --slurm`: slurmctld on
// the head, a slurmd per node), submitted with sbatch as a user would, with a small model:
//  - one_node.sbatch, 2 tasks of one node over shared memory, runs to its end;
//  - multi_node.sbatch with 3 tasks on 2 nodes, 2 on the first and 1 on the second
//    (SLURM_TASKS_PER_NODE=2,1): every task knows its own node's count (rank 2 is local 0 of 1), and
//    the job trains over mpi. SIGUSR1 to the batch script (what --signal=B:USR1@120 sends before the
//    time limit) stops every rank at one step with a checkpoint and stopped=signal; the script requeues
//    the job (scontrol requeue), SLURM runs it again (SLURM_RESTART_COUNT=1) and it resumes from the
//    checkpoint to its last epoch. Both runs' output is in the job's one output file (--open-mode=append);
//  - multi_node.sbatch with LAUNCH=mpirun (mpirun inside the allocation) runs the job's 3 tasks.
TEST_F(MultiNodeTest, SlurmBatchScriptsTrainOnUnequalNodesAndRequeueOnStop) {
  const std::string driver = dir_ + "/driver.sh";
  writeFile(driver, R"SH(set -u
cd "$DIR"
export COHORT MODEL=mlp:784,64,10 EPOCHS=3 COHORT_ARGS="--progress-every 1 --timeout 20"
# finished JOB SECONDS: waits until the job has ended (every wait here is bounded).
finished() {
  for i in $(seq $(( $2 * 2 ))); do
    state=$(scontrol show job "$1" | grep -o 'JobState=[A-Z_]*')
    case $state in JobState=COMPLETED|JobState=FAILED|JobState=CANCELLED|JobState=TIMEOUT|JobState=NODE_FAIL) break ;; esac
    sleep 0.5
  done
  echo "DRIVER job $1: $(scontrol show job "$1" | grep -oE '(JobState|Restarts|ExitCode|NodeList|NumTasks)=[^ ]*' | tr '\n' ' ')"
}
one=$(sbatch --parsable -N1 -n2 --ntasks-per-node=2 "$EXAMPLES/one_node.sbatch") || exit 90
echo "DRIVER one=$one"
finished "$one" 120
many=$(sbatch --parsable -N2 -n3 --ntasks-per-node=2 "$EXAMPLES/multi_node.sbatch") || exit 90
echo "DRIVER many=$many"
for i in $(seq 240); do grep -q "progress: epoch" "cohort-$many.out" 2>/dev/null && break; sleep 0.5; done
grep -q "progress: epoch" "cohort-$many.out" || echo "DRIVER no progress within 120 s"
scancel --batch --signal=USR1 "$many"
finished "$many" 200
# The same script with mpirun inside the allocation (through SLURM, not the cluster's rsh agent).
mpi=$(env -u OMPI_MCA_plm_rsh_agent -u OMPI_MCA_plm_rsh_no_tree_spawn LAUNCH=mpirun EPOCHS=1 \
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      sbatch --parsable -N2 -n3 --ntasks-per-node=2 "$EXAMPLES/multi_node.sbatch") || exit 90
echo "DRIVER mpi=$mpi"
finished "$mpi" 120
)SH");
  std::vector<std::string> env = env_;
  const std::string script = runfile("examples/slurm/one_node.sbatch");
  env.insert(env.end(), {"DIR=" + dir_, "COHORT=" + cohortBinary(), "EXAMPLES=" + script.substr(0, script.rfind('/'))});
  CommandResult r = runCommand({cluster_, "run", "2", "--rate", "1gbit", "--slurm", "--", "bash", driver},
                               {.timeout = std::chrono::seconds(400), .extraEnvironment = env});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  std::printf("%s", r.stdoutText.c_str());

  std::smatch oneMatch, manyMatch;
  ASSERT_TRUE(std::regex_search(r.stdoutText, oneMatch, std::regex("DRIVER one=([0-9]+)"))) << r.describe();
  ASSERT_TRUE(std::regex_search(r.stdoutText, manyMatch, std::regex("DRIVER many=([0-9]+)"))) << r.describe();
  const std::string oneId = oneMatch[1], manyId = manyMatch[1];
  auto output = [&](const std::string& id) {
    return fileExists(dir_ + "/cohort-" + id + ".out") ? readFile(dir_ + "/cohort-" + id + ".out") : "";
  };
  const std::string one = output(oneId);
  EXPECT_NE(r.stdoutText.find("DRIVER job " + oneId + ": JobState=COMPLETED Restarts=0"), std::string::npos)
      << r.describe() << one;
  EXPECT_NE(one.find("RESULT mode=allreduce backend=shm world_size=2 epochs=3"), std::string::npos) << one;

  const std::string out = output(manyId);
  const std::string all = r.describe() + "\njob " + manyId + "'s output:\n" + out;
  EXPECT_NE(r.stdoutText.find("DRIVER job " + manyId + ": JobState=COMPLETED Restarts=1 ExitCode=0:0"), std::string::npos)
      << all;
  // Two runs, each with the same three world lines: the first node's two tasks, the second's one.
  for (const char* world : {"rank 0 of 3 (local 0 of 2) on cohort-node0 from slurm variables",
                                   "rank 1 of 3 (local 1 of 2) on cohort-node0 from slurm variables",
                                   "rank 2 of 3 (local 0 of 1) on cohort-node1 from slurm variables"}) {
    EXPECT_EQ(linesWith(out, world).size(), 2u) << world << "\n" << all;
  }
  const std::vector<std::string> results = linesWith(out, "RESULT ");
  ASSERT_EQ(results.size(), 2u) << all;
  EXPECT_NE(results[0].find("RESULT mode=allreduce backend=mpi world_size=3 "), std::string::npos) << results[0];
  EXPECT_NE(results[0].find(" stopped=signal"), std::string::npos) << results[0];
  // The requeued run resumed where the first stopped and trained to the last epoch.
  const std::string second = out.substr(out.find(results[0]));
  EXPECT_NE(second.find("resumed from "), std::string::npos) << all;
  EXPECT_NE(results[1].find("RESULT mode=allreduce backend=mpi world_size=3 epochs=3 "), std::string::npos) << results[1];
  EXPECT_EQ(results[1].find("stopped="), std::string::npos) << results[1];
  EXPECT_EQ(nn::readCheckpoint(dir_ + "/cohort-" + manyId + ".safetensors").metadata["epoch"], "3");

  // LAUNCH=mpirun starts the job's 3 tasks, not a fixed count per node (it used to start 4 here).
  std::smatch mpiMatch;
  ASSERT_TRUE(std::regex_search(r.stdoutText, mpiMatch, std::regex("DRIVER mpi=([0-9]+)"))) << r.describe();
  const std::string mpi = output(mpiMatch[1]);
  EXPECT_NE(r.stdoutText.find("DRIVER job " + mpiMatch[1].str() + ": JobState=COMPLETED"), std::string::npos) << mpi;
  EXPECT_EQ(linesWith(mpi, "rank 2 of 3 (local 0 of 1) on cohort-node1 from openmpi variables").size(), 1u) << mpi;
  EXPECT_NE(mpi.find("RESULT mode=allreduce backend=mpi world_size=3 epochs=1 "), std::string::npos) << mpi;
}

}  // namespace
}  // namespace cohort::testing
