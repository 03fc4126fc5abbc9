// The nccl backend's GPU choice without a GPU: the device-count check and the two-ranks-on-one-GPU
// check are pure functions of what the ranks published (collectives/nccl/gpu_assignment.h).
#include "collectives/nccl/gpu_assignment.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/error.h"

namespace cohort::collectives::nccl {
namespace {

// The InvalidArgument's message, or a description of what happened instead.
template <class F>
std::string invalidArgumentOf(F body) {
  try {
    body();
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.code(), ExitCode::kUsage);
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no error";
}

TEST(CheckDeviceForLocalRank, EveryLocalRankBelowTheDeviceCountGetsItsOwnIndex) {
  for (int devices = 1; devices <= 8; ++devices) {
    for (int localRank = 0; localRank < devices; ++localRank) {
      EXPECT_EQ(checkDeviceForLocalRank(localRank, devices, nullptr), localRank);
    }
  }
}

TEST(CheckDeviceForLocalRank, MoreLocalRanksThanDevicesIsRefusedWithTheCount) {
  const std::string message = invalidArgumentOf([] { checkDeviceForLocalRank(2, 2, nullptr); });
  EXPECT_NE(message.find("local rank 2 on cuda:2"), std::string::npos) << message;
  EXPECT_NE(message.find("only 2 CUDA devices"), std::string::npos) << message;
  EXPECT_EQ(message.find("CUDA_VISIBLE_DEVICES="), std::string::npos) << message;  // unset: not mentioned
}

TEST(CheckDeviceForLocalRank, TheMessageShowsCudaVisibleDevicesWhenSet) {
  const std::string message = invalidArgumentOf([] { checkDeviceForLocalRank(1, 1, "3"); });
  EXPECT_NE(message.find("only 1 CUDA device (CUDA_VISIBLE_DEVICES=3)"), std::string::npos) << message;
}

TEST(CheckDeviceForLocalRank, NoDeviceAtAll) {
  const std::string message = invalidArgumentOf([] { checkDeviceForLocalRank(0, 0, ""); });
  EXPECT_NE(message.find("sees no CUDA device"), std::string::npos) << message;
}

TEST(CheckDeviceForLocalRank, NegativeLocalRankIsRefused) {
  EXPECT_NE(invalidArgumentOf([] { checkDeviceForLocalRank(-1, 4, nullptr); }), "no error");
}

std::vector<RankGpu> fourRanksOnTwoNodesWorth() {
  // Node-local table of a job with ranks 4..7 on this node (global rank = 4 + local rank).
  return {{.rank = 4, .localRank = 0, .deviceIndex = 0, .busId = "0000:1B:00.0"},
          {.rank = 5, .localRank = 1, .deviceIndex = 1, .busId = "0000:3B:00.0"},
          {.rank = 6, .localRank = 2, .deviceIndex = 2, .busId = "0000:5E:00.0"},
          {.rank = 7, .localRank = 3, .deviceIndex = 3, .busId = "0000:86:00.0"}};
}

TEST(CheckDistinctGpus, DistinctGpusPass) {
  EXPECT_NO_THROW(checkDistinctGpus(fourRanksOnTwoNodesWorth()));
  EXPECT_NO_THROW(checkDistinctGpus({}));
  EXPECT_NO_THROW(checkDistinctGpus({{.rank = 0, .localRank = 0, .deviceIndex = 0, .busId = "0000:01:00.0"}}));
}

TEST(CheckDistinctGpus, TwoRanksOnOneGpuNameBothRanksBothIndicesAndTheGpu) {
  // Local ranks 1 and 3 saw different CUDA_VISIBLE_DEVICES and ended up on the same GPU.
  std::vector<RankGpu> gpus = fourRanksOnTwoNodesWorth();
  gpus[3].busId = "0000:3B:00.0";
  const std::string message = invalidArgumentOf([&] { checkDistinctGpus(gpus); });
  EXPECT_NE(message.find("local ranks 1 (rank 5, cuda:1) and 3 (rank 7, cuda:3) are both on GPU 0000:3B:00.0"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << message;
}

TEST(CheckDistinctGpus, BusIdsCompareIgnoringCase) {
  std::vector<RankGpu> gpus = fourRanksOnTwoNodesWorth();
  gpus[2].busId = "0000:1b:00.0";
  const std::string message = invalidArgumentOf([&] { checkDistinctGpus(gpus); });
  EXPECT_NE(message.find("local ranks 0 (rank 4, cuda:0) and 2 (rank 6, cuda:2)"), std::string::npos) << message;
}

TEST(CheckDistinctGpus, TheFirstPairInLocalRankOrderIsReportedWhateverTheTableOrder) {
  std::vector<RankGpu> gpus = fourRanksOnTwoNodesWorth();
  for (RankGpu& g : gpus) g.busId = "0000:AF:00.0";  // all four on one GPU
  std::vector<RankGpu> reversed(gpus.rbegin(), gpus.rend());
  const std::string a = invalidArgumentOf([&] { checkDistinctGpus(gpus); });
  const std::string b = invalidArgumentOf([&] { checkDistinctGpus(reversed); });
  EXPECT_EQ(a, b);  // every rank builds the same message
  EXPECT_NE(a.find("local ranks 0 (rank 4, cuda:0) and 1 (rank 5, cuda:1)"), std::string::npos) << a;
}

}  // namespace
}  // namespace cohort::collectives::nccl
