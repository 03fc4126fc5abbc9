// The nccl backend's node rendezvous without a GPU (collectives/nccl/node_rendezvous.h): local ranks
// as forked processes publish made-up bus ids, local rank 0 a made-up NCCL unique id. Each test has
// a fresh COHORT_SHM_DIR that must be empty afterwards (no name is left behind), and a fresh job id.
#include "collectives/nccl/node_rendezvous.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "ipc/segment_header.h"
#include "runtime/error.h"
#include "tests/ipc/multiproc.h"

namespace cohort::collectives::nccl {
namespace {

using namespace std::chrono_literals;
using ipc::testing::forkChild;
using ipc::testing::freshJobId;
using ipc::testing::ScopedShmDir;
using ipc::testing::waitChild;

constexpr int kMessageMismatch = 42;  // a child's exit code: the error was of the right type, wrong text

std::string busIdOf(int localRank) { return "0000:" + std::to_string(10 + localRank) + ":00.0"; }

UniqueIdBytes idOfRound(int round) {
  UniqueIdBytes id;
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(round * 7 + i);
  return id;
}

NodeRendezvousOptions optionsFor(const std::string& job, int localRank, int localWorldSize,
                                 std::chrono::milliseconds timeout = 20s) {
  return {.jobId = job,
          .rank = 100 + localRank,
          .localRank = localRank,
          .localWorldSize = localWorldSize,
          .timeout = timeout};
}

// One local rank's rendezvous for round `round`, checked against what every rank must see.
// Returns 0 when all is well, 1 (after printing why) otherwise; errors propagate (exit code).
int meetAndCheck(const std::string& job, int localRank, int localWorldSize, int round, bool withId) {
  auto makeId = [round] { return idOfRound(round); };
  NodeRendezvousResult met = rendezvousOnNode(
      optionsFor(job, localRank, localWorldSize), {.deviceIndex = localRank, .busId = busIdOf(localRank)},
      withId ? std::function<UniqueIdBytes()>(makeId) : std::function<UniqueIdBytes()>());
  if (static_cast<int>(met.gpus.size()) != localWorldSize) {
    std::fprintf(stderr, "local rank %d: %zu gpus\n", localRank, met.gpus.size());
    return 1;
  }
  for (int k = 0; k < localWorldSize; ++k) {
    const RankGpu& g = met.gpus[k];
    if (g.localRank != k || g.rank != 100 + k || g.deviceIndex != k || g.busId != busIdOf(k)) {
      std::fprintf(stderr, "local rank %d: slot %d is {%d, %d, %d, %s}\n", localRank, k, g.rank, g.localRank,
                   g.deviceIndex, g.busId.c_str());
      return 1;
    }
  }
  if (met.uniqueId.has_value() != withId || (withId && *met.uniqueId != idOfRound(round))) {
    std::fprintf(stderr, "local rank %d, round %d: wrong unique id\n", localRank, round);
    return 1;
  }
  return 0;
}

// Runs `body` and returns 0 when it throws E with `needle` in its message, kMessageMismatch when the
// text differs, 1 when nothing is thrown (other exceptions propagate: forkChild maps them).
template <class E, class F>
int expectError(F body, const std::string& needle) {
  try {
    body();
  } catch (const E& e) {
    if (std::string(e.what()).find(needle) != std::string::npos) return 0;
    std::fprintf(stderr, "message without '%s': %s\n", needle.c_str(), e.what());
    return kMessageMismatch;
  }
  return 1;
}

// Whether the segment file's header says its creator has published it.
bool isPublished(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  ipc::SegmentHeader header{};
  const bool read = ::pread(fd, &header, sizeof header, 0) == static_cast<ssize_t>(sizeof header);
  ::close(fd);
  return read && header.magic == ipc::kSegmentMagic && header.ready.load() == 1;
}

bool directoryIsEmpty(const std::string& path) {
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return false;
  bool empty = true;
  const std::string privateDir = "cohort-" + std::to_string(geteuid());  // ipc/private_dir.h: stays
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == privateDir && directoryIsEmpty(path + "/" + name)) continue;
    if (name != "." && name != "..") {
      std::fprintf(stderr, "left behind: %s\n", name.c_str());
      empty = false;
    }
  }
  closedir(d);
  return empty;
}

TEST(NodeRendezvous, EveryLocalRankSeesEveryGpuAndLocalRankZerosUniqueId) {
  for (int ranks : {2, 3, 4}) {
    ScopedShmDir dir;
    const std::string job = freshJobId();
    std::vector<pid_t> children;
    for (int k = ranks - 1; k >= 0; --k) {  // openers first: they wait for the creator
      children.push_back(forkChild([&, k] { return meetAndCheck(job, k, ranks, 1, true); }));
    }
    for (pid_t c : children) EXPECT_EQ(waitChild(c), 0) << ranks << " ranks";
    EXPECT_TRUE(directoryIsEmpty(dir.path()));
  }
}

TEST(NodeRendezvous, WithoutAnIdMakerThereIsNoId) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  pid_t a = forkChild([&] { return meetAndCheck(job, 0, 2, 1, false); });
  pid_t b = forkChild([&] { return meetAndCheck(job, 1, 2, 1, false); });
  EXPECT_EQ(waitChild(a), 0);
  EXPECT_EQ(waitChild(b), 0);
  EXPECT_TRUE(directoryIsEmpty(dir.path()));
}

// Communicators created one after another reuse the name: a fast rank must never meet the
// previous round's segment (local rank 0 removes the name before anyone leaves a round).
TEST(NodeRendezvous, BackToBackRoundsNeverMix) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  constexpr int kRanks = 3;
  constexpr int kRounds = 25;
  std::vector<pid_t> children;
  for (int k = 0; k < kRanks; ++k) {
    children.push_back(forkChild([&, k] {
      for (int round = 0; round < kRounds; ++round) {
        if (int rc = meetAndCheck(job, k, kRanks, round, true); rc != 0) return rc;
      }
      return 0;
    }));
  }
  for (pid_t c : children) EXPECT_EQ(waitChild(c), 0);
  EXPECT_TRUE(directoryIsEmpty(dir.path()));
}

TEST(NodeRendezvous, OneLocalRankNeedsNoSegment) {
  ScopedShmDir dir;
  EXPECT_EQ(meetAndCheck(freshJobId(), 0, 1, 5, true), 0);
  EXPECT_EQ(meetAndCheck("local", 0, 1, 6, false), 0);
  EXPECT_TRUE(directoryIsEmpty(dir.path()));
}

TEST(NodeRendezvous, AMissingLocalRankIsNamedOnEveryOtherRank) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  auto meet = [&](int k) {
    return expectError<TimeoutError>(
        [&] { rendezvousOnNode(optionsFor(job, k, 3, 500ms), {.deviceIndex = k, .busId = busIdOf(k)}, {}); },
        "local rank 2 of 3 did not arrive within 0.5 s");
  };
  pid_t a = forkChild([&] { return meet(0); });
  // Local rank 1 times out as well, unless it sees local rank 0 give up first: then it says so, and
  // still names the missing rank.
  pid_t b = forkChild([&] {
    try {
      rendezvousOnNode(optionsFor(job, 1, 3, 500ms), {.deviceIndex = 1, .busId = busIdOf(1)}, {});
    } catch (const Error& e) {
      const std::string text = e.what();
      const bool timedOut = text.find("local rank 2 of 3 did not arrive within 0.5 s") != std::string::npos;
      const bool sawZeroExit = text.find("local rank 0 (pid") != std::string::npos &&
                               text.find("exited before local rank 2 of 3 arrived") != std::string::npos;
      if (timedOut || sawZeroExit) return 0;
      std::fprintf(stderr, "unexpected: %s\n", e.what());
      return kMessageMismatch;
    }
    return 1;
  });
  EXPECT_EQ(waitChild(a, 20s), 0);
  EXPECT_EQ(waitChild(b, 20s), 0);
  EXPECT_TRUE(directoryIsEmpty(dir.path()));
}

TEST(NodeRendezvous, AMissingLocalRankZeroIsNamed) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  EXPECT_EQ(expectError<TimeoutError>(
                [&] { rendezvousOnNode(optionsFor(job, 1, 2, 300ms), {.deviceIndex = 1, .busId = busIdOf(1)}, {}); },
                "local rank 0 (which starts the nccl rendezvous)"),
            0);
}

TEST(NodeRendezvous, LocalWorldSizesThatDifferAreRefused) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  pid_t creator = forkChild([&] {
    return expectError<TimeoutError>(
        [&] { rendezvousOnNode(optionsFor(job, 0, 2, 2s), {.deviceIndex = 0, .busId = busIdOf(0)}, {}); },
        "local rank 1 of 2 did not arrive");
  });
  pid_t opener = forkChild([&] {
    return expectError<InvalidArgument>(
        [&] { rendezvousOnNode(optionsFor(job, 1, 3, 10s), {.deviceIndex = 1, .busId = busIdOf(1)}, {}); },
        "local rank 1 was told 3 ranks on this node, but local rank 0 was told 2");
  });
  EXPECT_EQ(waitChild(opener, 20s), 0);
  EXPECT_EQ(waitChild(creator, 20s), 0);
}

TEST(NodeRendezvous, TwoProcessesWithOneLocalRankAreRefused) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  // Local rank 0 waits for a third rank that never comes, so both claimants of local rank 1 find
  // the segment open; exactly one of them is refused.
  pid_t creator = forkChild([&] {
    return expectError<TimeoutError>(
        [&] { rendezvousOnNode(optionsFor(job, 0, 3, 3s), {.deviceIndex = 0, .busId = busIdOf(0)}, {}); },
        "local rank 2 of 3 did not arrive");
  });
  auto claim = [&] {
    return forkChild([&] {
      try {
        rendezvousOnNode(optionsFor(job, 1, 3, 3s), {.deviceIndex = 1, .busId = busIdOf(1)}, {});
      } catch (const InvalidArgument& e) {
        return std::string(e.what()).find("local rank 1 arrived twice") != std::string::npos ? 10 : kMessageMismatch;
      } catch (const TimeoutError&) {
        return 11;
      } catch (const PeerError&) {
        return 11;  // local rank 0 gave up (timed out) and exited just before this one did
      }
      return 1;
    });
  };
  pid_t first = claim();
  pid_t second = claim();
  const int a = waitChild(first, 20s);
  const int b = waitChild(second, 20s);
  EXPECT_EQ(a + b, 21) << a << " " << b;  // one refused (10), one failed with the others (11)
  EXPECT_EQ(waitChild(creator, 20s), 0);
}

TEST(NodeRendezvous, LocalRankZeroDyingIsAPeerErrorOnTheOthers) {
  ScopedShmDir dir;
  const std::string job = freshJobId();
  pid_t creator = forkChild([&] {
    rendezvousOnNode(optionsFor(job, 0, 3, 60s), {.deviceIndex = 0, .busId = busIdOf(0)}, {});
    return 1;  // not reached: local rank 2 never comes and the test kills this process
  });
  pid_t opener = forkChild([&] {
    return expectError<PeerError>(
        [&] { rendezvousOnNode(optionsFor(job, 1, 3, 60s), {.deviceIndex = 1, .busId = busIdOf(1)}, {}); }, "exited");
  });
  // Kill local rank 0 once it has published the segment (the opener has arrived or will open the
  // published file and find its creator gone). Before publishing, a dead creator is only noticed
  // at the opener's timeout (ipc::ShmRegion::open), which is not what this test is about.
  const std::string segment =
      dir.path() + "/cohort-" + std::to_string(geteuid()) + "/cohort." + job + ".nccl";  // ipc/private_dir.h
  const auto end = std::chrono::steady_clock::now() + 20s;
  while (!isPublished(segment) && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(isPublished(segment)) << "local rank 0 never published " << segment;
  kill(creator, SIGKILL);
  EXPECT_EQ(waitChild(creator), -SIGKILL);
  EXPECT_EQ(waitChild(opener, 20s), 0);
}

}  // namespace
}  // namespace cohort::collectives::nccl
