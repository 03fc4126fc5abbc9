// agreement_bench: what the start-up agreement on the job's settings (issue 15; train::Job::agree,
// collectives::compareAcrossRanks) costs a job of N workers on one node. Forks N ranks with
// cohortrun's variables; each calls compareAcrossRanks on a 1 KiB description, ITERS times (each
// call its own segment, as a job's place() and Trainer do), and reports the time from the call to
// its return on the slowest rank: the delay the agreement adds to a start once every rank is there.
//
//   bazel run //bench:agreement_bench -- [RANKS] [ITERS]      # defaults 2, 200
// Prints "RESULT bench=agreement ranks=N bytes=1024 median_us=… p90_us=… max_us=…".
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/agreement.h"
#include "ipc/job_segment.h"
#include "runtime/world_info.h"

namespace {

using namespace cohort;
using Clock = std::chrono::steady_clock;

int runRank(int rank, int ranks, int iters, const std::string& job, int resultFd) {
  runtime::WorldInfo world;
  world.rank = world.localRank = rank;
  world.worldSize = world.localWorldSize = ranks;
  world.jobId = job;
  world.source = "cohortrun";
  ipc::JobSegment line({.jobId = job, .localRank = rank, .localWorldSize = ranks, .name = "line"});
  const std::string settings(1024, 's');
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    line.barrier().arriveAndWait(rank, {.what = "line up", .timeout = std::chrono::seconds(30)});
    const auto start = Clock::now();
    const auto c = collectives::compareAcrossRanks(settings, {.world = world, .name = "bench-" + std::to_string(i)});
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    if (c.firstDiffering >= 0) return 1;
  }
  if (rank == 0) line.unlinkName();
  return ::write(resultFd, us.data(), us.size() * sizeof(double)) == static_cast<ssize_t>(us.size() * sizeof(double)) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int ranks = argc > 1 ? std::atoi(argv[1]) : 2;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 200;
  const std::string job = "agreement-bench-" + std::to_string(::getpid());
  std::vector<int> fds;
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    int p[2];
    if (::pipe(p) != 0) return 1;
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      ::_exit(runRank(r, ranks, iters, job, p[1]));
    }
    ::close(p[1]);
    fds.push_back(p[0]);
    pids.push_back(pid);
  }
  // The slowest rank of each call.
  std::vector<double> slowest(static_cast<size_t>(iters), 0.0);
  for (int fd : fds) {
    std::vector<double> us(static_cast<size_t>(iters));
    size_t got = 0, want = us.size() * sizeof(double);
    while (got < want) {
      ssize_t n = ::read(fd, reinterpret_cast<char*>(us.data()) + got, want - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (got != want) {
      std::fprintf(stderr, "agreement_bench: a rank failed\n");
      return 1;
    }
    for (size_t i = 0; i < us.size(); ++i) slowest[i] = std::max(slowest[i], us[i]);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::sort(slowest.begin(), slowest.end());
  std::printf("RESULT bench=agreement ranks=%d bytes=1024 median_us=%.1f p90_us=%.1f max_us=%.1f\n", ranks,
              slowest[slowest.size() / 2], slowest[slowest.size() * 9 / 10], slowest.back());
  return failed ? 1 : 0;
}
