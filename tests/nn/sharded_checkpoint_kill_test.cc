// A writer of sharded checkpoints killed with SIGKILL at random moments (before, during and after
// its shard writes and its manifest's rename) always leaves the last committed checkpoint whole.
//
// A child writes generation after generation (every rank's shard file, then the manifest), each
// with data that follows from its generation, and tells the parent through a pipe that it started
// and, after each commit returns, which generation it committed. The parent kills it after a
// random delay (a seeded RNG picks the moment; nothing waits on it for synchronisation), then reads
// the checkpoint: it must be the last generation the child reported or the one after (killed
// between the rename and the report), whole and with that generation's data. A new child then
// resumes from nextShardGeneration, alternating the world size.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "nn/sharded_checkpoint.h"
#include "runtime/error.h"
#include "tests/nn/sharded_checkpoint_fixture.h"

namespace cohort::nn {
namespace {

using testing::TempDir;

constexpr int kKills = 20;

// The child: writes until killed. Never returns.
[[noreturn]] void writeForever(const std::string& path, int worldSize, int reportFd) {
  try {
    uint64_t generation = nextShardGeneration(path);
    const char started = 'S';
    if (::write(reportFd, &started, 1) != 1) ::_exit(3);
    for (;; ++generation) {
      testing::writeGeneration(path, worldSize, generation, {{"generation", std::to_string(generation)}});
      if (::write(reportFd, &generation, sizeof generation) != sizeof generation) ::_exit(3);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "writer child failed: %s\n", e.what());
    ::_exit(4);
  }
}

// The last generation the dead child reported after its "started" byte, or `before` if none.
uint64_t lastReported(int fd, uint64_t before) {
  std::string bytes;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    bytes.append(buf, static_cast<size_t>(n));
  }
  const size_t reports = bytes.size() / sizeof(uint64_t);  // each written whole: a pipe write under PIPE_BUF
  if (reports == 0) return before;
  uint64_t generation = 0;
  std::memcpy(&generation, bytes.data() + (reports - 1) * sizeof generation, sizeof generation);
  return generation;
}

TEST(ShardedCheckpointKill, AKilledWriterAlwaysLeavesTheLastCommittedCheckpointWhole) {
  TempDir dir;
  const std::string path = dir.file("run.st");
  testing::writeGeneration(path, 2, 1, {{"generation", "1"}});
  uint64_t committed = 1;
  std::mt19937_64 rng(46);
  std::uniform_int_distribution<int> delayMicros(0, 20000);
  for (int kill = 0; kill < kKills; ++kill) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const int worldSize = 2 + kill % 3;  // 2, 3, 4
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::close(fds[0]);
      writeForever(path, worldSize, fds[1]);
    }
    ::close(fds[1]);
    char first = 0;
    ASSERT_EQ(::read(fds[0], &first, 1), 1) << "the writer died before it started";
    std::this_thread::sleep_for(std::chrono::microseconds(delayMicros(rng)));  // picks the moment only
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited by itself, status " << status;
    const uint64_t reported = lastReported(fds[0], committed);
    ::close(fds[0]);
    const ShardedManifest manifest = readShardedManifest(path);
    EXPECT_TRUE(manifest.generation == reported || manifest.generation == reported + 1)
        << "kill " << kill << ": the manifest commits generation " << manifest.generation << ", the writer reported "
        << reported;
    const Checkpoint ckpt = readShardedCheckpoint(path);
    testing::expectGeneration(ckpt, manifest.generation);
    EXPECT_EQ(ckpt.metadata.at("generation"), std::to_string(manifest.generation));
    committed = manifest.generation;
  }
  // One clean commit removes what the killed writers left: other generations and their temporaries.
  testing::writeGeneration(path, 3, nextShardGeneration(path));
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) left.push_back(e.path().filename());
  EXPECT_EQ(left.size(), 4u) << "the manifest and 3 shard files; found " << ::testing::PrintToString(left);
  std::printf("%d kills, last committed generation %llu\n", kKills, static_cast<unsigned long long>(committed));
}

}  // namespace
}  // namespace cohort::nn
