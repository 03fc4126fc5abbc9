// Failures across nodes fail fast and name the lost rank and its host (issue 19), on the simulated
// cluster (scripts/cluster, 2 nodes x 2 workers, allreduce over mpi, mpirun on the head node):
//   - a node cut off the switch mid-training (over mpi, over the default: hierarchical with replicas,
//     and over hierarchical with one copy per node): the ranks on the other node fail within
//     --timeout naming ranks of the lost node and its host; mpirun exits non-zero (once the login node's TCP gives up
//     on the lost node's daemon: net.ipv4.tcp_retries2=5 on the head, see docs/cluster.md "Failures");
//   - a worker on node 1 SIGKILLed mid-training: mpirun ends the job within seconds, non-zero, naming
//     the rank, its PID and its node;
//   - one rank on node 1 issuing a different collective (the COHORT_TEST_MPI_MISMATCH hook of the mpi
//     backend): every rank fails with the fingerprints' "collective mismatch" naming ranks and hosts;
//   - node 1's ranks started with another --lr (mpirun's MPMD syntax): refused naming both ranks;
//   - Hogwild across nodes with node 1 killed mid-run: node 0's ranks name the lost node's ranks;
//   - node 1 unreachable before mpirun starts: mpirun fails within the timeout naming it (the rsh
//     agent's connect, as ssh's).
// Each leaves nothing in any node's /dev/shm (looked at inside each node before the cluster goes down).
// Each test brings up a cluster of its own name, drives the job from a script on the head node (which
// starts mpirun, waits for training to run, injects the fault and waits for mpirun, every wait
// bounded), and takes the cluster down in TearDown.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "tests/cli/cli_test_support.h"
#include "tests/cluster/cluster_test.h"
#include "tests/support/process.h"

namespace cohort::testing {
namespace {

constexpr int kTimeoutS = 10;  // cohort train --timeout

// What the head-node driver reports (lines "DRIVER key=value") and what mpirun printed.
struct FaultRun {
  CommandResult command;
  int mpirunExit = -1;        // -1: the driver did not say (it failed before)
  long faultToExitMs = -1;    // from the fault to mpirun's exit
  long faultToErrorMs = -1;   // from the fault to the first "cohort: error:" line seen (-1: none)
  bool mpirunKilled = false;  // still running 90 s after the fault: the driver SIGKILLed it
  std::string log;            // mpirun's stdout and stderr (every rank's, merged)
};

long driverValue(const std::string& text, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex("DRIVER " + key + "=(-?[0-9]+)"))) return -1;
  return std::stol(m[1]);
}

std::string join(const std::vector<std::string>& words) {
  std::string line;
  for (const std::string& w : words) line += (line.empty() ? "'" : " '") + w + "'";
  return line;
}

class FaultTest : public ClusterTest {
 protected:
  FaultTest() : ClusterTest("cf") {}
  void SetUp() override {
    ClusterTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    CommandResult up = cluster({"up", "2", "--rate", "1gbit"}, std::chrono::seconds(60));
    ASSERT_EQ(up.exitCode, 0) << up.describe();
    up_ = true;
  }
  void TearDown() override {
    if (!up_) return ClusterTest::TearDown();
    CommandResult down = cluster({"down"}, std::chrono::seconds(60));
    EXPECT_EQ(down.exitCode, 0) << down.describe();
    CommandResult status = cluster({"status"});
    EXPECT_NE(status.stdoutText.find(": down"), std::string::npos) << "the cluster is gone: " << status.describe();
  }

  // `cohort train ... extra` on 2 nodes x 2 workers; with node1Extra, mpirun's MPMD form
  // "-np 2 PROGRAM ARGS : -np 2 PROGRAM ARGS" gives node 1's ranks node1Extra instead of extra.
  // `mode`: the flags that choose the mode and how gradients are averaged.
  std::string mpirunLine(const std::vector<std::string>& extra, const std::vector<std::string>& node1Extra = {},
                         const std::string& mpirunOptions = "",
                         const std::vector<std::string>& mode = {"--mode", "allreduce", "--backend", "mpi"}) {
    std::vector<std::string> train = {
        cohortBinary(), "train",     "--data",           "synthetic", "--model",   "mlp:784,64,10",
        "--threads",    "1",         "--batch-size",     "8",         "--epochs",  "1000",
        "--seed",       "5",         "--progress-every", "1",         "--timeout", std::to_string(kTimeoutS)};
    train.insert(train.end(), mode.begin(), mode.end());
    std::string line =
        "mpirun --allow-run-as-root --oversubscribe --bind-to none --host cohort-node0:2,cohort-node1:2 " +
        mpirunOptions;
    std::vector<std::string> node0 = train;
    node0.insert(node0.end(), extra.begin(), extra.end());
    if (node1Extra.empty()) return line + " -np 4 " + join(node0);
    std::vector<std::string> node1 = train;
    node1.insert(node1.end(), node1Extra.begin(), node1Extra.end());
    return line + " -np 2 " + join(node0) + " : -np 2 " + join(node1);
  }

  // Runs on the head node: `prepare`, then mpirun in the background; once rank 0 reports progress
  // (training runs on every rank), `fault`; then waits for mpirun (at most 90 s, else SIGKILL).
  FaultRun drive(const std::string& mpirun, const std::string& fault, const std::string& prepare = "") {
    const std::string log = dir_ + "/mpirun.log";
    const std::string script = R"SH(set -u
cd /
log=')SH" + log + R"SH('
CLUSTER=')SH" + cluster_ + R"SH('
now() { echo $(( ${EPOCHREALTIME/./} / 1000 )); }
)SH" + prepare + R"SH(
)SH" + mpirun + R"SH( >"$log" 2>&1 </dev/null &
pid=$!
for i in $(seq 600); do grep -q "progress: epoch" "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
if ! grep -q "progress: epoch" "$log"; then echo "DRIVER no progress within 60 s"; kill -KILL $pid; cat "$log"; exit 90; fi
t0=$(now)
)SH" + fault + R"SH(
t_err=-1
for i in $(seq 900); do
  [ $t_err = -1 ] && grep -q "cohort: error:" "$log" && t_err=$(( $(now) - t0 ))
  kill -0 $pid 2>/dev/null || break
  sleep 0.1
done
if kill -0 $pid 2>/dev/null; then echo "DRIVER killed=1"; kill -KILL $pid; fi
wait $pid
echo "DRIVER mpirun_exit=$?"
echo "DRIVER fault_to_exit_ms=$(( $(now) - t0 ))"
[ $t_err = -1 ] && grep -q "cohort: error:" "$log" && t_err=$(( $(now) - t0 ))
echo "DRIVER fault_to_error_ms=$t_err"
)SH";
    writeFile(dir_ + "/driver.sh", script);
    FaultRun run;
    run.command = cluster({"exec", "head", "bash", dir_ + "/driver.sh"}, std::chrono::seconds(200));
    run.mpirunExit = static_cast<int>(driverValue(run.command.stdoutText, "mpirun_exit"));
    run.faultToExitMs = driverValue(run.command.stdoutText, "fault_to_exit_ms");
    run.faultToErrorMs = driverValue(run.command.stdoutText, "fault_to_error_ms");
    run.mpirunKilled = driverValue(run.command.stdoutText, "killed") == 1;
    run.log = fileExists(log) ? readFile(log) : "";
    return run;
  }

  // What node K's /dev/shm holds (empty: nothing), checked inside the node. The private
  // directories cohort-<uid> (ipc/private_dir.h) stay, empty: what counts is what is in them. A
  // killed rank's claim (ipc/rank_claim.h: a socket file, which outlives a SIGKILLed holder, unlike
  // the abstract socket it was) stays as an empty entry until the user's next job removes it; it
  // holds no memory, and no process may still listen on it. Every segment must be gone.
  void expectEmptyShm(int node) {
    CommandResult ls = cluster({"exec", std::to_string(node), "sh", "-c",
                                "ls -A /dev/shm | grep -v '^cohort-[0-9]*$'; for d in /dev/shm/cohort-*/; do "
                                "[ -d \"$d\" ] || continue; find \"$d\" -mindepth 1 ! -type s; "
                                "for c in $(find \"$d\" -mindepth 1 -type s); do "
                                "ss -xlH 2>/dev/null | grep -qF \"$c\" && echo \"$c is still listened on\"; done; done; true"});
    ASSERT_EQ(ls.exitCode, 0) << ls.describe();
    EXPECT_EQ(ls.stdoutText, "") << "node " << node << "'s /dev/shm";
  }

  // A node lost mid-run: mpirun ends by itself, non-zero, within --timeout + 30 s of the fault (once
  // the head's TCP gives up on the lost node's daemon), and the first error comes when the wait in
  // flight at the fault runs out. False when mpirun had to be killed.
  static bool expectEndedAfterLostNode(const FaultRun& run, const std::string& all) {
    EXPECT_FALSE(run.mpirunKilled) << all;
    EXPECT_NE(run.mpirunExit, 0) << all;
    EXPECT_LT(run.faultToExitMs, (kTimeoutS + 30) * 1000) << all;
    EXPECT_GE(run.faultToErrorMs, 0) << all;
    EXPECT_LT(run.faultToErrorMs, (kTimeoutS + 3) * 1000) << all;
    return !run.mpirunKilled;
  }

  bool up_ = false;
};

// Prints what mpirun printed, less the ranks' start-up and training lines: what a user sees of a failure.
void show(const std::string& what, const std::string& log) {
  std::string shown;
  for (size_t at = 0; at < log.size();) {
    size_t end = log.find('\n', at);
    if (end == std::string::npos) end = log.size();
    const std::string line = log.substr(at, end - at);
    at = end + 1;
    if (!std::regex_search(line,
                           std::regex(R"(\] (rank [0-9]+ of|cohort train:|effective batch|progress:|epoch [0-9]+/))")))
      shown += line + "\n";
  }
  std::printf("--- %s: what mpirun printed (start-up and training lines left out) ---\n%s", what.c_str(),
              shown.c_str());
}

// The lines of rank `rank` that report an error of cohort.
std::vector<std::string> errorsOf(const std::string& log, int rank) {
  return linesWith(log, "[rank " + std::to_string(rank) + "] cohort: error: ");
}

// Over flat mpi, over the default across nodes (hierarchical, replicas), and over hierarchical with
// one shared copy per node (--no-replicas), where each rank of node 0 waits on its partner of node 1
// (the same local rank) and a rank whose partner answered before the cut waits at its node's barrier
// for the other local rank: that one's network wait runs out first (node waits are graded longer)
// and it tells the waiting rank which ranks were lost (ipc::ProcessBarrier::abandon).
class NodeCut : public FaultTest, public ::testing::WithParamInterface<std::vector<std::string>> {};

TEST_P(NodeCut, NodeCutOffTheSwitchIsNamedByTheOtherNodesRanks) {
  // Linux gives up on a connection with unacknowledged data after tcp_retries2 retransmissions (15 by
  // default: about 15 minutes); mpirun only exits once its connection to the lost node's daemon does
  // (docs/cluster.md "Failures"). 5 (about 13 s) on the head node, whose network namespace is its own.
  FaultRun run = drive(mpirunLine({}, {}, "", GetParam()), R"SH("$CLUSTER" link 1 down)SH",
                       "sysctl -q -w net.ipv4.tcp_retries2=5");
  show("node 1 cut off", run.log);
  const std::string all = run.command.describe() + "\nmpirun's output:\n" + run.log;
  ASSERT_TRUE(expectEndedAfterLostNode(run, all));
  // Every rank of node 0 names ranks of node 1 only, with their host; which message depends on where
  // the cut caught the collective: its fingerprints ("did not arrive") or its data ("nothing heard").
  const std::regex lost(
      R"(collective #[0-9]+ [a-z]+\(.*\): (.*every rank arrived, but MPI did not finish the data )"
      R"(transfer within 10 s: nothing heard from (rank|ranks) ([23] \(cohort-node1\)(, )?)+ for 5 s|)"
      R"((rank|ranks) ([23] \(cohort-node1\)(, )?)+ did not arrive within 10 s))");
  for (int rank : {0, 1}) {
    std::vector<std::string> errors = errorsOf(run.log, rank);
    ASSERT_EQ(errors.size(), 1u) << "rank " << rank << "\n" << all;
    EXPECT_TRUE(std::regex_search(errors[0], lost)) << errors[0] << "\n" << all;
    EXPECT_EQ(errors[0].find("cohort-node0"), std::string::npos) << errors[0];
  }
  expectEmptyShm(0);
  expectEmptyShm(1);
}

INSTANTIATE_TEST_SUITE_P(Backends, NodeCut,
                         ::testing::Values(std::vector<std::string>{"--mode", "allreduce", "--backend", "mpi"},
                                           std::vector<std::string>{"--mode", "allreduce"},
                                           std::vector<std::string>{"--mode", "allreduce", "--no-replicas"}),
                         [](const ::testing::TestParamInfo<std::vector<std::string>>& info) {
                           return info.param.size() == 2 ? std::string("default") : info.param.back() == "mpi" ? "mpi" : "shared_per_node";
                         });

// Node 1 cut off before mpirun starts: mpirun starts its daemons through the rsh agent, which, as ssh
// does, reaches the node over the network first and fails naming it after its ConnectTimeout (here
// the job's --timeout, through plm_rsh_args); mpirun then ends at once. (Before, the agent started
// node 1's daemon anyway, which could not call mpirun back: mpirun said nothing for about 2 minutes.)
TEST_F(FaultTest, UnreachableNodeAtStartIsNamedWithinTheTimeout) {
  const std::string script = "cd / && \"$CLUSTER\" link 1 down && t0=${EPOCHREALTIME/./} && "
                             "timeout 150 " + mpirunLine({}, {}, "--mca plm_rsh_args '-o ConnectTimeout=" +
                                                                  std::to_string(kTimeoutS) + "'") +
                             "; echo \"DRIVER mpirun_exit=$?\"; echo \"DRIVER ms=$(( (${EPOCHREALTIME/./} - t0) / 1000 ))\"";
  CommandResult r = runCommand({cluster_, "exec", "head", "bash", "-c", "CLUSTER='" + cluster_ + "'; " + script},
                               {.timeout = std::chrono::seconds(200), .extraEnvironment = env_});
  show("node 1 unreachable at start", r.stdoutText + r.stderrText);
  const long exit = driverValue(r.stdoutText, "mpirun_exit"), ms = driverValue(r.stdoutText, "ms");
  EXPECT_NE(exit, 0) << r.describe();
  EXPECT_NE(exit, 124) << "mpirun still running after 150 s\n" << r.describe();
  EXPECT_LT(ms, (kTimeoutS + 10) * 1000) << r.describe();
  const std::string out = r.stdoutText + r.stderrText;
  // The head's ARP finds nobody (no route to host, after about 3 s), or the node's address is still
  // cached and the connection attempt is never answered (timed out).
  EXPECT_TRUE(std::regex_search(out, std::regex(R"(ssh: connect to host cohort-node1 port 22: )"
                                                R"((No route to host|Connection timed out) \(cluster rsh: node 1, )"
                                                R"(cohort-node1 at 10\.77\.0\.2, cannot be reached from the head node )"
                                                R"(within 10 s: its link is down or it is gone\))")))
      << r.describe();
  EXPECT_NE(out.find("ORTE was unable to reliably start one or more daemons"), std::string::npos) << r.describe();
  EXPECT_EQ(out.find("cohort-node0 port 22"), std::string::npos) << "node 0 is reachable\n" << r.describe();
  expectEmptyShm(0);
}

// Hogwild across nodes (docs/cluster.md, "Hogwild across nodes"): node 1 dies mid-run, as a machine
// does (cut off the switch, then every process of it killed at once with its holder, PID 1 of the
// node). Node 0 stops within --timeout naming node 1's ranks: its leader (rank 0) when its next
// averaging round or meeting waits for node 1's leader, its worker (rank 1) when the epoch's meeting
// of all ranks does; the first to fail ends the job (mpirun stops the other). Nothing is left in
// node 0's /dev/shm.
TEST_F(FaultTest, HogwildNodeKilledMidRunIsNamedByTheSurvivingNode) {
  FaultRun run = drive(mpirunLine({}, {}, "", {"--mode", "hogwild"}),
                       R"SH("$CLUSTER" link 1 down
read -r holder start <"$COHORT_CLUSTER_DIR/node1.pid" && kill -KILL "$holder")SH",
                       "sysctl -q -w net.ipv4.tcp_retries2=5");
  show("hogwild: node 1 killed", run.log);
  const std::string all = run.command.describe() + "\nmpirun's output:\n" + run.log;
  ASSERT_TRUE(expectEndedAfterLostNode(run, all));
  // Whichever of node 0's ranks waits on node 1 first fails first, and mpirun may end the other before
  // its own wait runs out: at least one says it, and each that does names a rank of node 1. The leader
  // waits on node 1's leader alone; the worker, at an epoch's meeting of all ranks, may also name the
  // leader beside it, which had not come because it was itself waiting on node 1.
  const std::regex lost(R"((rank|ranks) ([0-3] \(cohort-node[01]\)(, )?)*[23] \(cohort-node1\)(, )?)"
                        R"(([0-3] \(cohort-node[01]\)(, )?)* (did not arrive|for 5 s))");
  std::vector<std::string> errors = errorsOf(run.log, 0);
  for (const std::string& error : errors) EXPECT_EQ(error.find("cohort-node0"), std::string::npos) << error;
  const std::vector<std::string> worker = errorsOf(run.log, 1);
  errors.insert(errors.end(), worker.begin(), worker.end());
  ASSERT_FALSE(errors.empty()) << all;
  for (const std::string& error : errors) EXPECT_TRUE(std::regex_search(error, lost)) << error << "\n" << all;
  expectEmptyShm(0);
}

TEST_F(FaultTest, KilledWorkerEndsTheJobNamingItsRankAndHost) {
  // The oldest `cohort` process of node 1 (in node 1's own PID namespace), and its world rank.
  FaultRun run = drive(
      mpirunLine({}),
      R"SH("$CLUSTER" exec 1 sh -c 'p=$(pgrep -o -x cohort); sed -z -n "s/^OMPI_COMM_WORLD_RANK=//p" /proc/$p/environ | tr -d "\0" >"$0"; kill -KILL $p' "$log.victim"
echo "DRIVER victim=$(cat "$log.victim")")SH");
  const std::string all = run.command.describe() + "\nmpirun's output:\n" + run.log;
  const long victim = driverValue(run.command.stdoutText, "victim");
  show("rank " + std::to_string(victim) + " killed", run.log);
  ASSERT_TRUE(victim == 2 || victim == 3) << all;
  ASSERT_FALSE(run.mpirunKilled) << all;
  EXPECT_NE(run.mpirunExit, 0) << all;
  EXPECT_LT(run.faultToExitMs, 10000) << all;  // mpirun sees it at once; well under --timeout
  const std::regex noticed("mpirun noticed that process rank " + std::to_string(victim) +
                           " with PID [0-9]+ on node cohort-node1 exited on signal 9 \\(Killed\\)");
  EXPECT_TRUE(std::regex_search(run.log, noticed)) << all;
  expectEmptyShm(0);
  expectEmptyShm(1);
}

TEST_F(FaultTest, MismatchedCollectiveOnOneNodeIsNamedByEveryRank) {
  // Rank 3 (node 1) issues its collective #50 with one element fewer: a gradient all-reduce, well into
  // training. No network fault: every rank's message reaches mpirun.
  CommandResult r = cluster({"exec", "head", "bash", "-c",
                             "cd / && " + mpirunLine({"--max-steps", "200"}, {}, "-x COHORT_TEST_MPI_MISMATCH=3:50")},
                            std::chrono::seconds(120));
  show("rank 3 issued a different collective", r.stdoutText + r.stderrText);
  EXPECT_NE(r.exitCode, 0) << r.describe();
  const std::regex mismatch(
      R"(collective mismatch: ranks 0 \(cohort-node0\), 1 \(cohort-node0\), 2 \(cohort-node1\) )"
      R"(issued #50 ([a-z]+)\(([a-z]+), float32, ([0-9]+) elements\) but rank 3 \(cohort-node1\) )"
      R"(issued #50 ([a-z]+)\(([a-z]+), float32, ([0-9]+) elements\) \(no data was exchanged\))");
  int reported = 0;
  for (int rank = 0; rank < 4; ++rank) {
    for (const std::string& line : errorsOf(r.stdoutText + r.stderrText, rank)) {
      std::smatch m;
      ASSERT_TRUE(std::regex_search(line, m, mismatch)) << line << "\n" << r.describe();
      EXPECT_EQ(m[1], m[4]) << line;
      EXPECT_EQ(std::stol(m[3]), std::stol(m[6]) + 1) << line;
      ++reported;
    }
  }
  // Every rank reaches the same verdict at once; the first to exit makes mpirun end the others, which
  // may be killed before they print: at least one says it, and none says anything else.
  EXPECT_GE(reported, 1) << r.describe();
  expectEmptyShm(0);
  expectEmptyShm(1);
}

TEST_F(FaultTest, DifferentSettingsOnOneNodeAreRefusedNamingBothRanks) {
  // mpirun's MPMD form: ranks 0, 1 (node 0) with --lr 0.05, ranks 2, 3 (node 1) with --lr 0.1.
  CommandResult r =
      cluster({"exec", "head", "bash", "-c",
               "cd / && " + mpirunLine({"--lr", "0.05", "--max-steps", "200"}, {"--lr", "0.1", "--max-steps", "200"})},
              std::chrono::seconds(120));
  show("node 1 started with another --lr", r.stdoutText + r.stderrText);
  EXPECT_NE(r.exitCode, 0) << r.describe();
  const std::string message =
      "ranks 0 (cohort-node0) and 2 (cohort-node1) were started with different settings: lr is 0.05 on rank 0 but 0.1 "
      "on rank 2";
  const std::string out = r.stdoutText + r.stderrText;
  EXPECT_NE(out.find(message), std::string::npos) << r.describe();
  EXPECT_EQ(out.find("step 1 "), std::string::npos) << "no rank trained a step: " << r.describe();
  expectEmptyShm(0);
  expectEmptyShm(1);
}

}  // namespace
}  // namespace cohort::testing
