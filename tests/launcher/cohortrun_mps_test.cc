// cohortrun --mps and the note on workers sharing a GPU, end to end, without a GPU or MPS: each
// test writes a fake nvidia-cuda-mps-control (a shell script, first on PATH) that records every
// call and its CUDA_MPS_* variables in a file, and with -d makes $CUDA_MPS_PIPE_DIRECTORY/control
// (a FIFO); `quit` on its stdin is recorded and removes it. Workers (test_worker --record) append
// to the same file, so its order is the order of events. GPUs are a fake
// /proc/driver/nvidia/gpus ($COHORT_NVIDIA_GPUS_DIR); TMPDIR, where the job's directory goes, and
// CUDA_MPS_PIPE_DIRECTORY (the "system" daemon's) are the test's own. The job's directory is read
// from the fake's record, never from a worker's output that a stopped job may not have printed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "runtime/unique_fd.h"
#include "tests/launcher/launcher_test_support.h"

namespace cohort::launcher::testing {
namespace {

using std::chrono::seconds;

// Written into each test's bin/nvidia-cuda-mps-control; RECORD is replaced by the record file.
// FAKE_MPS_NO_PIPE: -d starts a "daemon" (this script, --serve, which the kernel names
// nvidia-cuda-mps like the real one) that writes its pid file but never makes the control pipe.
constexpr const char* kFakeDaemon = R"(#!/bin/sh
record='RECORD'
if [ "$1" = -d ]; then
  echo "daemon -d pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> "$record"
  echo "fake control daemon up" > "$CUDA_MPS_LOG_DIRECTORY/control.log"
  if [ -n "$FAKE_MPS_NO_PIPE" ]; then
    "$0" --serve < /dev/null > /dev/null 2>&1 &
    echo $! > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
    echo "daemon pid $!" >> "$record"
    exit 0
  fi
  mkfifo "$CUDA_MPS_PIPE_DIRECTORY/control"
  exit 0
fi
if [ "$1" = --serve ]; then
  while :; do sleep 0.05; done
fi
read command
echo "client $command pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> "$record"
if [ "$command" = quit ]; then rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"; fi
)";

bool startsWith(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

class CohortrunMpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = freshTempDir();
    for (const char* sub : {"shm", "tmp", "bin", "nobin", "gpus", "gpus/0000:17:00.0", "nogpus", "system-mps"}) {
      ASSERT_EQ(::mkdir((dir_ + "/" + sub).c_str(), 0700), 0) << sub;
    }
    record_ = dir_ + "/record";
    std::string script = kFakeDaemon;
    script.replace(script.find("RECORD"), 6, record_);
    const std::string fake = dir_ + "/bin/nvidia-cuda-mps-control";
    std::ofstream(fake) << script;
    ASSERT_EQ(::chmod(fake.c_str(), 0755), 0);
  }

  // One GPU, no MPS daemon of the system's, the fake first on PATH; `extra` replaces any of these.
  std::vector<std::string> env(const std::vector<std::string>& extra) const {
    std::vector<std::string> env = {"COHORT_SHM_DIR=" + dir_ + "/shm",
                                    "TMPDIR=" + dir_ + "/tmp",
                                    "COHORT_NVIDIA_GPUS_DIR=" + dir_ + "/gpus",
                                    "CUDA_MPS_PIPE_DIRECTORY=" + dir_ + "/system-mps",
                                    "CUDA_MPS_LOG_DIRECTORY=" + dir_ + "/system-mps-log",
                                    "PATH=" + dir_ + "/bin:" + std::getenv("PATH")};
    for (const std::string& e : extra) {
      const std::string name = e.substr(0, e.find('=') + 1);
      std::erase_if(env, [&](const std::string& entry) { return startsWith(entry, name); });
      env.push_back(e);
    }
    return env;
  }
  std::vector<std::string> argv(const std::vector<std::string>& launcherArgs,
                                const std::vector<std::string>& workerArgs) const {
    std::vector<std::string> args = {cohortrun()};
    args.insert(args.end(), launcherArgs.begin(), launcherArgs.end());
    args.insert(args.end(), {"--", testWorker(), "--record", record_});
    args.insert(args.end(), workerArgs.begin(), workerArgs.end());
    return args;
  }
  Output launch(const std::vector<std::string>& launcherArgs, const std::vector<std::string>& workerArgs,
                const std::vector<std::string>& extraEnv = {}) {
    std::vector<std::string> args = argv(launcherArgs, workerArgs);
    return runLauncher({args.begin() + 1, args.end()}, env(extraEnv));
  }

  std::vector<std::string> recorded() const {
    std::ifstream in(record_);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }
  std::vector<std::string> leftInTmp() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir_ + "/tmp")) names.push_back(entry.path());
    return names;
  }
  // The job's directory, as the fake daemon recorded it (written before any worker starts, so it
  // is there however early the job was stopped): <TMPDIR>/cohortrun-<job id>-XXXXXX (mkdtemp).
  std::string jobDirectory(const Output&) const {
    const std::string start = "daemon -d pipe=", end = "/mps-pipe ";
    for (const std::string& line : recorded()) {
      if (startsWith(line, start) && line.find(end) != std::string::npos) {
        return line.substr(start.size(), line.find(end) - start.size());
      }
    }
    return "";
  }
  // The line the fake or a worker records with the job's two directories.
  std::string variables(const Output& r) const {
    return "pipe=" + jobDirectory(r) + "/mps-pipe log=" + jobDirectory(r) + "/mps-log";
  }
  std::string workerVariables(const Output& r) const {
    return "CUDA_MPS_PIPE_DIRECTORY=" + jobDirectory(r) + "/mps-pipe CUDA_MPS_LOG_DIRECTORY=" + jobDirectory(r) +
           "/mps-log";
  }

  std::string dir_;
  std::string record_;
};

TEST_F(CohortrunMpsTest, TheJobsDaemonServesEveryWorkerAndIsStoppedAfterThem) {
  Output r = launch({"--nproc-per-node", "2", "--mps"}, {"--device", "cuda:0", "--print-env"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  const std::vector<std::string> lines = recorded();
  ASSERT_EQ(lines.size(), 6u) << r.describe();
  EXPECT_EQ(lines[0], "daemon -d " + variables(r));
  // mkdtemp's: a name no other user can make first (issue 44).
  const std::string prefix = dir_ + "/tmp/cohortrun-" + printedEnv(r.out, 0, "COHORT_JOB_ID") + "-";
  EXPECT_TRUE(startsWith(jobDirectory(r), prefix) && jobDirectory(r).size() == prefix.size() + 6) << jobDirectory(r);
  for (size_t i = 1; i < 5; ++i) EXPECT_TRUE(startsWith(lines[i], "worker ")) << lines[i];
  for (const std::string rank : {"0", "1"}) {
    EXPECT_EQ(std::count(lines.begin(), lines.end(), "worker " + rank + " start " + workerVariables(r)), 1) << rank;
    EXPECT_EQ(std::count(lines.begin(), lines.end(), "worker " + rank + " end 0"), 1) << rank;
  }
  EXPECT_EQ(lines[5], "client quit " + variables(r));
  EXPECT_EQ(linesWith(r.err, "cohortrun: started an MPS control daemon for this job (CUDA_MPS_PIPE_DIRECTORY=" +
                                 jobDirectory(r) + "/mps-pipe)")
                .size(),
            1u)
      << r.describe();
  EXPECT_TRUE(linesWith(r.err, "note:").empty()) << r.describe();  // the workers share a GPU: --mps is right
  EXPECT_TRUE(leftInTmp().empty()) << leftInTmp()[0];
}

TEST_F(CohortrunMpsTest, OneDaemonServesEveryAttemptAndIsStoppedAfterAWorkerFails) {
  Output r = launch({"--nproc-per-node", "2", "--mps", "--max-restarts", "1"},
                    {"--device", "cuda:0", "--print-env", "--rank", "1", "--steps", "1", "--at-step", "0"});
  ASSERT_EQ(r.exitCode, 3) << r.describe();
  const std::vector<std::string> lines = recorded();
  ASSERT_FALSE(lines.empty()) << r.describe();
  EXPECT_EQ(lines.front(), "daemon -d " + variables(r));
  EXPECT_EQ(std::count_if(lines.begin(), lines.end(), [](const std::string& l) { return !startsWith(l, "worker "); }),
            2)
      << "one daemon for both attempts, one quit";
  EXPECT_EQ(std::count(lines.begin(), lines.end(), "worker 1 start " + workerVariables(r)), 2);
  EXPECT_EQ(std::count(lines.begin(), lines.end(), "worker 1 end 3"), 2);
  EXPECT_EQ(lines.back(), "client quit " + variables(r));
  EXPECT_TRUE(leftInTmp().empty()) << leftInTmp()[0];
}

TEST_F(CohortrunMpsTest, ASignalStopsTheWorkersAndThenTheDaemon) {
  Child run =
      Child::start(argv({"--nproc-per-node", "2", "--mps"}, {"--device", "cuda:0", "--print-env", "--hang"}), env({}));
  run.readUntil([](const Output& o) { return linesWith(o.out, "] pid ").size() == 2; }, seconds(20));
  const std::vector<pid_t> pids = workerPids(run.output().out);
  ASSERT_EQ(::kill(run.pid(), SIGTERM), 0);
  const Output& r = run.finish(seconds(20));
  EXPECT_EQ(r.exitCode, 143) << r.describe();
  for (pid_t pid : pids) EXPECT_TRUE(processGone(pid));
  const std::vector<std::string> lines = recorded();
  ASSERT_EQ(lines.size(), 4u) << r.describe();  // the hanging workers record no end
  EXPECT_EQ(lines.back(), "client quit " + variables(r));
  EXPECT_TRUE(leftInTmp().empty()) << leftInTmp()[0];
}

TEST_F(CohortrunMpsTest, AMissingDaemonProgramIsOneLineAndExitCode2BeforeAnyWorker) {
  Output r = launch({"--nproc-per-node", "2", "--mps"}, {"--device", "cuda:0"}, {"PATH=" + dir_ + "/nobin"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  EXPECT_EQ(r.err,
            "cohortrun: error: --mps: nvidia-cuda-mps-control was not found on PATH (it comes with NVIDIA's driver; or "
            "leave --mps out and start MPS yourself, docs/gpu.md)\n");
  EXPECT_TRUE(r.out.empty()) << r.describe();
  EXPECT_TRUE(recorded().empty());
  EXPECT_TRUE(leftInTmp().empty()) << leftInTmp()[0];
}

TEST_F(CohortrunMpsTest, ADaemonThatNeverMakesItsControlPipeTimesOutAndIsKilled) {
  Output r = launch({"--nproc-per-node", "2", "--mps", "--mps-timeout", "0.5"}, {"--device", "cuda:0"},
                    {"FAKE_MPS_NO_PIPE=1"});
  EXPECT_EQ(r.exitCode, 2) << r.describe();
  ASSERT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.describe();
  EXPECT_TRUE(startsWith(
      r.err, "cohortrun: error: --mps: the MPS control daemon did not create " + dir_ + "/tmp/cohortrun-cr-"))
      << r.err;
  // (Under Bazel the test's directory is too long for a real daemon's socket, and the message says so.)
  EXPECT_NE(r.err.find("/mps-pipe/control within 0.5 s"), std::string::npos) << r.err;
  EXPECT_TRUE(r.err.ends_with("; it said: fake control daemon up\n")) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.describe();  // no worker started
  const std::vector<std::string> lines = recorded();
  ASSERT_EQ(lines.size(), 2u);
  ASSERT_TRUE(startsWith(lines[1], "daemon pid ")) << lines[1];
  EXPECT_TRUE(waitUntilGone(std::stoi(lines[1].substr(11)), seconds(10))) << "the fake daemon outlived cohortrun";
  EXPECT_TRUE(leftInTmp().empty()) << leftInTmp()[0];
}

TEST_F(CohortrunMpsTest, TheNoteOnASharedGpuComesOnceAndOnlyWhenNoDaemonAnswers) {
  // Two attempts, one note: rank 1 fails the first.
  Output r = launch({"--nproc-per-node", "2", "--max-restarts", "1"},
                    {"--device", "cuda:0", "--rank", "1", "--fail-first-attempt"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(linesWith(r.err, "cohortrun: note: 2 workers share GPU cuda:0 but no MPS daemon answers at " + dir_ +
                                 "/system-mps/control, so the GPU time-slices between them")
                .size(),
            1u)
      << r.describe();
  EXPECT_EQ(linesWith(r.err, "note:").size(), 1u) << r.describe();
  EXPECT_EQ(linesWith(r.err, "add --mps to start a daemon for this job (docs/gpu.md)").size(), 1u) << r.describe();

  auto noNote = [&](const std::vector<std::string>& launcherArgs, const std::vector<std::string>& workerArgs,
                    const std::vector<std::string>& extraEnv, const char* why) {
    Output o = launch(launcherArgs, workerArgs, extraEnv);
    EXPECT_EQ(o.exitCode, 0) << why << "\n" << o.describe();
    EXPECT_TRUE(linesWith(o.err, "note:").empty()) << why << "\n" << o.describe();
  };
  noNote({"--nproc-per-node", "2"}, {"--device", "cuda"}, {}, "a GPU per worker");
  noNote({"--nproc-per-node", "1"}, {"--device", "cuda:0"}, {}, "one worker");
  noNote({"--nproc-per-node", "2"}, {"--device", "cpu"}, {}, "no GPU in the command");
  noNote({"--nproc-per-node", "2"}, {"--device", "cuda:0"}, {"COHORT_NVIDIA_GPUS_DIR=" + dir_ + "/nogpus"},
         "no GPU on the machine");
  noNote({"--nproc-per-node", "2"}, {"--device", "cuda:0"}, {"CUDA_VISIBLE_DEVICES="}, "no GPU visible");
  {
    const std::string control = dir_ + "/system-mps/control";
    ASSERT_EQ(::mkfifo(control.c_str(), 0600), 0);
    runtime::UniqueFd daemon(::open(control.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    noNote({"--nproc-per-node", "2"}, {"--device", "cuda:0"}, {}, "the system's daemon answers");
  }
  // A daemon that is gone leaves its control file: the note comes.
  Output stale = launch({"--nproc-per-node", "2"}, {"--device=cuda:0"});
  EXPECT_EQ(linesWith(stale.err, "cohortrun: note: 2 workers share GPU cuda:0").size(), 1u) << stale.describe();
}

TEST_F(CohortrunMpsTest, MpsWhereNoGpuIsSharedSaysItIsNotNeededAndStartsItAnyway) {
  Output r = launch({"--nproc-per-node", "2", "--mps"}, {"--device", "cuda", "--print-env"});
  ASSERT_EQ(r.exitCode, 0) << r.describe();
  EXPECT_EQ(linesWith(r.err,
                      "cohortrun: note: --mps: MPS is not needed, as far as cohortrun can tell: each worker "
                      "gets its own GPU (--device cuda) (the daemon runs anyway)")
                .size(),
            1u)
      << r.describe();
  EXPECT_EQ(recorded().front(), "daemon -d " + variables(r));
  EXPECT_EQ(recorded().back(), "client quit " + variables(r));
  EXPECT_TRUE(leftInTmp().empty()) << leftInTmp()[0];
}

}  // namespace
}  // namespace cohort::launcher::testing
