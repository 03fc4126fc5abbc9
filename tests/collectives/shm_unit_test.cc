// Fast tests of the shm backend's pieces in one process: the reduce kernels, fingerprint text, the
// one-rank communicator, and a two-rank all-reduce with ranks as forked processes.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/shm/reduce_kernels.h"
#include "collectives/shm/shm_communicator.h"
#include "runtime/error.h"
#include "tests/collectives/job_runner.h"

namespace cohort::collectives {
namespace {

TEST(ReduceKernels, EveryOpAndSourceCount) {
  for (int k = 1; k <= 9; ++k) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{17}, size_t{10007}}) {
      std::vector<std::vector<float>> data(k, std::vector<float>(count));
      std::vector<const float*> sources;
      for (int s = 0; s < k; ++s) {
        for (size_t i = 0; i < count; ++i) data[s][i] = static_cast<float>((i * 7 + s * 5) % 13) - 6.0f;
        sources.push_back(data[s].data());
      }
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        std::vector<float> out(count, NAN);
        shm::reduceInto(out.data(), sources.data(), k, count, op, 1.0f / static_cast<float>(k));
        for (size_t i = 0; i < count; ++i) {
          float sum = 0, hi = -1e9f, lo = 1e9f;
          for (int s = 0; s < k; ++s) {
            sum += data[s][i];
            hi = std::max(hi, data[s][i]);
            lo = std::min(lo, data[s][i]);
          }
          float want = op == ReduceOp::kSum   ? sum
                       : op == ReduceOp::kMax ? hi
                       : op == ReduceOp::kMin ? lo
                                              : sum * (1.0f / k);
          ASSERT_EQ(out[i], want) << toString(op) << " k=" << k << " i=" << i;
        }
      }
    }
  }
}

TEST(ReduceKernels, InPlaceIntoTheFirstSource) {
  std::vector<float> a(1000, 1.0f), b(1000, 2.0f), c(1000, 4.0f);
  const float* sources[] = {a.data(), b.data(), c.data()};
  shm::reduceInto(a.data(), sources, 3, a.size(), ReduceOp::kSum, 1.0f);
  for (float x : a) ASSERT_EQ(x, 7.0f);
}

TEST(Fingerprint, Text) {
  Fingerprint fp{.sequence = 12, .kind = CollectiveKind::kAllReduce, .op = ReduceOp::kAvg, .count = 1000};
  EXPECT_EQ(fp.str(), "#12 allreduce(avg, float32, 1000 elements)");
  Fingerprint b{.sequence = 3, .kind = CollectiveKind::kBroadcast, .root = 2, .count = 5};
  EXPECT_EQ(b.str(), "#3 broadcast(root 2, float32, 5 elements)");
}

TEST(ShmCommunicator, OneRankCopiesAndIsUsableAsync) {
  runtime::WorldInfo world;  // a single process
  auto comm = makeShmCommunicator({.backend = "shm", .world = world, .timeout = std::chrono::seconds(5)});
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->backend(), "shm");
  std::vector<float> in{1, 2, 3}, out(3, 0);
  auto a = comm->allReduce(in.data(), out.data(), 3, {.op = ReduceOp::kAvg});
  auto b = comm->barrier();
  std::vector<float> gathered(3, 0);
  auto c = comm->allGather(in.data(), gathered.data(), 3, {});
  a->wait(std::chrono::seconds(5));
  b->wait(std::chrono::seconds(5));
  c->wait(std::chrono::seconds(5));
  EXPECT_TRUE(a->done());
  EXPECT_EQ(out, in);
  EXPECT_EQ(gathered, in);
  comm->broadcast(in.data(), 3, 0)->wait(std::chrono::seconds(5));
  EXPECT_THROW(comm->broadcast(in.data(), 3, 1), InvalidArgument);
  EXPECT_THROW(comm->allReduce(nullptr, out.data(), 3, {}), InvalidArgument);
}

// Two ranks as forked processes (each its own communicator): a real segment, no launcher.
TEST(ShmCommunicator, TwoForkedRanksAllReduce) {
  const std::string shmDir = testing::freshDir("shm");
  setenv("COHORT_SHM_DIR", shmDir.c_str(), 1);
  std::vector<pid_t> children;
  for (int r = 0; r < 2; ++r) {
    children.push_back(testing::forkChild([r] {
      runtime::WorldInfo world{
          .rank = r, .worldSize = 2, .localRank = r, .localWorldSize = 2, .jobId = "unit-" + std::to_string(getppid())};
      auto comm = makeShmCommunicator({.backend = "shm", .world = world, .timeout = std::chrono::seconds(20)});
      std::vector<float> data(100000, static_cast<float>(r + 1));
      comm->allReduce(data.data(), data.data(), data.size(), {})->wait(std::chrono::seconds(20));
      for (float x : data) {
        if (x != 3.0f) return 1;
      }
      return 0;
    }));
  }
  for (pid_t pid : children) EXPECT_EQ(testing::waitChild(pid, std::chrono::seconds(30)), 0);
  EXPECT_TRUE(testing::dirIsEmpty(shmDir));
  unsetenv("COHORT_SHM_DIR");
}

}  // namespace
}  // namespace cohort::collectives
