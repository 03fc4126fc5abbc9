#include "ipc/barrier.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "ipc/shm_region.h"
#include "tests/ipc/multiproc.h"

namespace cohort::ipc {
namespace {

using namespace std::chrono_literals;
using testing::forkChild;
using testing::freshJobId;
using testing::ScopedShmDir;
using testing::waitChild;

// Barrier memory in this process only, for tests that need no second process.
struct LocalBarrierMemory {
  explicit LocalBarrierMemory(int n)
      : bytes(ProcessBarrier::bytesFor(n)), memory(std::aligned_alloc(64, bytes), std::free) {
    ProcessBarrier::initialize(memory.get(), bytes, n);
  }
  size_t bytes;
  std::unique_ptr<void, void (*)(void*)> memory;
};

// A barrier for n ranks followed by n uint64 slots, in a published segment of a fresh job.
size_t payloadFor(int n) { return ProcessBarrier::bytesFor(n) + n * sizeof(uint64_t); }

ShmRegion createBarrierSegment(const std::string& job, int n) {
  ShmRegion r = ShmRegion::create({.jobId = job, .name = "barrier", .payloadBytes = payloadFor(n)});
  ProcessBarrier::initialize(r.payload(), ProcessBarrier::bytesFor(n), n);
  r.publish();
  return r;
}

ShmRegion openBarrierSegment(const std::string& job, int n) {
  return ShmRegion::open({.jobId = job, .name = "barrier", .payloadBytes = payloadFor(n), .timeout = 30s});
}

// A fresh job whose barrier segment for n ranks this process created; it is rank 0.
struct BarrierJob {
  explicit BarrierJob(int ranks)
      : n(ranks), region(createBarrierSegment(job, n)), barrier(region.payload(), ProcessBarrier::bytesFor(n)) {}
  // Forks rank `rank`: it maps the segment, passes the barrier 'registered' and runs `body`.
  pid_t forkRank(int rank, const std::function<int(ProcessBarrier&)>& body) const {
    return forkChild([&] {
      ShmRegion mine = openBarrierSegment(job, n);
      ProcessBarrier b(mine.payload(), ProcessBarrier::bytesFor(n));
      b.arriveAndWait(rank, {.what = "registered", .timeout = 30s});
      return body(b);
    });
  }

  ScopedShmDir dir;  // first: the segment is created in it
  std::string job = freshJobId();
  int n;
  ShmRegion region;
  ProcessBarrier barrier;
};

// Each round: every rank writes the round into its slot, meets the others, checks that all slots
// hold the round, and meets them again before anyone overwrites. Returns 0 or the failing round.
int runRounds(ShmRegion& region, int rank, int n, int rounds) {
  ProcessBarrier barrier(region.payload(), ProcessBarrier::bytesFor(n));
  auto* slots =
      reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(region.payload()) + ProcessBarrier::bytesFor(n));
  for (int round = 1; round <= rounds; ++round) {
    slots[rank].store(round, std::memory_order_relaxed);
    barrier.arriveAndWait(rank, {.what = "written", .timeout = 30s});
    for (int r = 0; r < n; ++r) {
      if (slots[r].load(std::memory_order_relaxed) != static_cast<uint64_t>(round)) return round;
    }
    barrier.arriveAndWait(rank, {.what = "checked", .timeout = 30s});
  }
  return barrier.generationOf(rank) == static_cast<uint64_t>(2 * rounds) ? 0 : -1;
}

class BarrierAcrossProcesses : public ::testing::TestWithParam<int> {};

TEST_P(BarrierAcrossProcesses, ManyRoundsStayInStep) {
  const int n = GetParam();
  const int rounds = 300;
  ScopedShmDir dir;
  const std::string job = freshJobId();
  ShmRegion region = createBarrierSegment(job, n);
  std::vector<pid_t> children;
  for (int rank = 1; rank < n; ++rank) {
    children.push_back(forkChild([&, rank] {
      ShmRegion mine = openBarrierSegment(job, n);
      return runRounds(mine, rank, n, rounds);
    }));
  }
  EXPECT_EQ(runRounds(region, 0, n, rounds), 0);
  for (pid_t c : children) EXPECT_EQ(waitChild(c), 0);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, BarrierAcrossProcesses, ::testing::Values(2, 3, 4));

TEST(ProcessBarrier, ThreadsOfOneProcessCanBeRanks) {
  const int n = 3;
  LocalBarrierMemory mem(n);
  std::atomic<int> counter{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      ProcessBarrier barrier(mem.memory.get(), mem.bytes);
      for (int round = 1; round <= 100; ++round) {
        counter.fetch_add(1);
        barrier.arriveAndWait(rank, {.what = "add", .timeout = 30s});
        if (counter.load() != n * round) failures.fetch_add(1);
        barrier.arriveAndWait(rank, {.what = "check", .timeout = 30s});
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(ProcessBarrier, TimeoutNamesTheMissingRanks) {
  LocalBarrierMemory mem(4);
  ProcessBarrier barrier(mem.memory.get(), mem.bytes);
  barrier.arrive(2);
  auto start = std::chrono::steady_clock::now();
  try {
    barrier.arriveAndWait(0, {.what = "start", .timeout = 300ms});
    ADD_FAILURE() << "the barrier did not time out";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("barrier 'start' timed out after 0.3 s: ranks 1, 3 of 4 did not arrive"),
              std::string::npos)
        << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, 300ms);
}

// A rank that fails elsewhere tells the ranks waiting for it why at once: its timeout stays a
// timeout (the same exit code), anything else is a PeerError; the first reason is the one kept.
TEST(ProcessBarrier, ARankThatAbandonsFailsItsWaitersAtOnceWithItsReason) {
  LocalBarrierMemory mem(3);
  ProcessBarrier barrier(mem.memory.get(), mem.bytes);
  barrier.arrive(2);
  std::thread failing([&] {
    std::this_thread::sleep_for(100ms);
    barrier.abandon(1, TimeoutError("collective #7 allreduce: nothing heard from rank 5 (node1) for 5 s"));
    barrier.abandon(2, PeerError("a later reason"));
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    barrier.arriveAndWait(0, {.what = "gradient norm", .timeout = 30s});
    ADD_FAILURE() << "the barrier passed without rank 1";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(std::string(e.what()),
              "local rank 1 failed while rank 0 waited at barrier 'gradient norm': collective #7 allreduce: nothing "
              "heard from rank 5 (node1) for 5 s");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  failing.join();
  // Later waits fail alike; the rank that gave up is not told its own reason.
  EXPECT_THROW(barrier.wait(2, 2, {.what = "later", .timeout = 30s}), TimeoutError);

  LocalBarrierMemory other(2);
  ProcessBarrier peer(other.memory.get(), other.bytes);
  peer.abandon(1, InvalidArgument(std::string(2000, 'x')));
  try {
    peer.arriveAndWait(0, {.what = "start", .timeout = 30s});
    ADD_FAILURE() << "the barrier passed without rank 1";
  } catch (const PeerError& e) {
    EXPECT_LT(std::string(e.what()).size(), 600u) << "a long reason is cut to the record's size";
  }
}

// The race these two tests pin down: a waiter read the arrivals and only afterwards judged the rank
// it found missing — by its process (the liveness check, every 20 ms) or by a failure recorded with
// abandon(). The last rank to arrive does not wait: it passes at once and may exit (a worker after
// its last barrier) or fail in its next step. If it arrived and did so inside the waiter's window,
// a barrier that had completed failed with "rank 1 (pid P) exited while rank 0 waited at barrier
// 'last'" or with rank 1's reason. The window is a /proc read or a few loads wide, so loaded
// machines hit it rarely; the test hook holds the waiter inside it until rank 1 has arrived and
// exited (or given up). Fixed by reading the verdict first and the arrivals after it.
TEST(ProcessBarrier, ARankThatArrivesAndExitsDuringALivenessCheckIsNoPeerError) {
  BarrierJob j(2);
  ProcessBarrier& barrier = j.barrier;
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  pid_t last = j.forkRank(1, [&](ProcessBarrier& b) {
    pollfd wake{.fd = go[0], .events = POLLIN, .revents = 0};
    if (poll(&wake, 1, 30000) != 1) return 10;
    b.arriveAndWait(1, {.what = "last", .timeout = 30s});  // the last to arrive: passes at once, exits
    return 0;
  });
  barrier.arriveAndWait(0, {.what = "registered", .timeout = 30s});
  int lastExit = -1;
  auto arriveAndExit = [&](ProcessBarrier::WaitPoint point, int rank) {
    if (point != ProcessBarrier::WaitPoint::kProcessUnknown || rank != 1 || lastExit != -1) return;
    ASSERT_EQ(write(go[1], "x", 1), 1);
    lastExit = waitChild(last);  // arrived, passed, exited and reaped: its pid names no process
  };
  EXPECT_NO_THROW(barrier.arriveAndWait(0, {.what = "last", .timeout = 30s, .testHook = arriveAndExit}));
  if (lastExit == -1) lastExit = waitChild(last);
  EXPECT_EQ(lastExit, 0);
  close(go[0]);
  close(go[1]);
}

TEST(ProcessBarrier, ARankThatPassesAndThenAbandonsDoesNotFailTheBarrierItPassed) {
  LocalBarrierMemory mem(2);
  ProcessBarrier barrier(mem.memory.get(), mem.bytes);
  bool passed = false;
  auto passAndGiveUp = [&](ProcessBarrier::WaitPoint point, int rank) {
    if (point != ProcessBarrier::WaitPoint::kRankMissing || rank != 1 || passed) return;
    barrier.arriveAndWait(1, {.what = "passed", .timeout = 30s});  // rank 0 is there: returns at once
    passed = true;
    barrier.abandon(1, PeerError("rank 1 failed after the barrier"));
  };
  EXPECT_NO_THROW(barrier.arriveAndWait(0, {.what = "passed", .timeout = 30s, .testHook = passAndGiveUp}));
  EXPECT_TRUE(passed);
  // The next barrier cannot complete: there rank 1's failure is reported at once.
  EXPECT_THROW(barrier.arriveAndWait(0, {.what = "next", .timeout = 30s}), PeerError);
}

TEST(ProcessBarrier, RejectsMemoryThatHoldsNoBarrier) {
  std::unique_ptr<void, void (*)(void*)> memory(std::aligned_alloc(64, 4096), std::free);
  std::memset(memory.get(), 0, 4096);
  EXPECT_THROW(ProcessBarrier(memory.get(), 4096), IoError);
}

TEST(ProcessBarrier, APeerKilledWhileOthersWaitIsAPeerErrorNotAHang) {
  BarrierJob j(3);
  ProcessBarrier& barrier = j.barrier;
  pid_t victim = j.forkRank(1, [](ProcessBarrier& b) {
    // Killed while waiting here, without arriving at the generation the others wait for next.
    b.wait(1, 1000, {.what = "never", .timeout = 60s});
    return 0;
  });
  pid_t witness = j.forkRank(2, [](ProcessBarrier& b) {
    b.arriveAndWait(2, {.what = "start", .timeout = 30s});  // must end with PeerError (exit code 4)
    return 0;
  });
  barrier.arriveAndWait(0, {.what = "registered", .timeout = 30s});
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  auto start = std::chrono::steady_clock::now();
  try {
    barrier.arriveAndWait(0, {.what = "start", .timeout = 30s});
    ADD_FAILURE() << "the barrier passed without rank 1";
  } catch (const PeerError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 (pid " + std::to_string(victim) +
                                         ") exited while rank 0 waited at barrier 'start'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(waitChild(victim), -SIGKILL);
  EXPECT_EQ(waitChild(witness), static_cast<int>(ExitCode::kPeerFailed));
}

}  // namespace
}  // namespace cohort::ipc
