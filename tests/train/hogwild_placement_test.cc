// Hogwild across real processes: every worker's optimizer steps land in the one shared buffer.
//
// Each of W forked workers places the model with a HogwildPlacement (rank 0 initialises, the others
// attach to the shared segment) and runs K SGD
// steps with gradient 1 over its own contiguous slice of the flat buffer (slice r of W), so the
// workers write disjoint elements and every element must end exactly K·lr below its initial value —
// which holds only if every worker's writes reached the one buffer every process sees.
// (Over the whole buffer, as real Hogwild training does, a step rewrites every element, and two
// workers' read-modify-writes of the same element can lose one update: accepted by design, so not
// what this test checks.) Values are exactly representable (lr = 0.25, K = 8, multiples of 1/4).
#include "train/placement/hogwild_placement.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "nn/model_spec.h"
#include "nn/optimizer.h"

namespace cohort::train {
namespace {

constexpr int kSteps = 8;
constexpr float kLr = 0.25f;

std::string freshJobId() {
  static std::atomic<int> counter{0};
  return "hogwild-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

float initialValue(size_t i) { return static_cast<float>(i % 17) * 0.25f; }

// Runs one worker; returns a process exit code (0 = all checks passed).
int worker(const std::string& jobId, int rank, int world) {
  using namespace nn;
  auto model = buildModel("mlp:7,5,3");
  model->params.allocate(runtime::cpuAllocator());
  auto whole = makeOptimizer({.kind = OptimizerKind::kSgd, .lr = kLr}, model->params.numel());
  const runtime::WorldInfo info{
      .rank = rank, .worldSize = world, .localRank = rank, .localWorldSize = world, .jobId = jobId};
  int initialised = 0;
  train::Timeline timeline;  // inactive
  HogwildPlacement sync({.params = model->params,
                        .optimizer = *whole,
                        .world = info,
                        .timeout = std::chrono::seconds(30),
                        .initialise =
                            [&] {
                              ++initialised;
                              for (size_t i = 0; i < model->params.numel(); ++i) {
                                model->params.values().at(static_cast<int64_t>(i)) = initialValue(i);
                              }
                            },
                        .timeline = timeline});
  if (initialised != (rank == 0 ? 1 : 0)) return 4;  // only the creator initialises
  const int64_t n = static_cast<int64_t>(model->params.numel());
  const int64_t begin = n * rank / world, end = n * (rank + 1) / world;
  auto opt = makeOptimizer({.kind = OptimizerKind::kSgd, .lr = kLr}, static_cast<size_t>(end - begin));
  opt->setSweepStart(static_cast<size_t>((end - begin) / 2));  // as Hogwild workers do
  model->params.grads().fill(1.0f);
  Tensor mySlice = model->params.values().narrowRows(begin, end - begin);
  Tensor myGrads = model->params.grads().narrowRows(begin, end - begin);
  std::unique_ptr<JobCollectives> collectives = sync.makeCollectives();
  collectives->barrier("start");
  for (int s = 0; s < kSteps; ++s) opt->step(mySlice, myGrads);
  double samples = kSteps;
  collectives->reduce({&samples, 1}, ScalarOp::kSum);
  int bad = 0;
  for (size_t i = 0; i < model->params.numel(); ++i) {
    bad += model->params.values().at(static_cast<int64_t>(i)) != initialValue(i) - kSteps * kLr;
  }
  if (samples != double{kSteps} * world) return 3;
  collectives->barrier("checked");
  return bad == 0 ? 0 : 2;
}

void runWorkers(int world) {
  const std::string jobId = freshJobId();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 1;
      try {
        code = worker(jobId, r, world);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      _exit(code);
    }
    pids.push_back(pid);
  }
  for (int r = 0; r < world; ++r) {
    int status = 0;
    ASSERT_EQ(waitpid(pids[static_cast<size_t>(r)], &status, 0), pids[static_cast<size_t>(r)]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << r << " of " << world << ": status " << status << " (2: a worker's update is missing)";
  }
}

class HogwildTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = std::string(tmp ? tmp : "/tmp") + "/shm-XXXXXX";
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
    setenv("COHORT_SHM_DIR", dir_.c_str(), 1);
  }
  std::string dir_;
};

TEST_F(HogwildTest, EveryWorkersUpdatesLandInTheSharedBufferWith2Workers) { runWorkers(2); }
TEST_F(HogwildTest, EveryWorkersUpdatesLandInTheSharedBufferWith3Workers) { runWorkers(3); }
TEST_F(HogwildTest, EveryWorkersUpdatesLandInTheSharedBufferWith4Workers) { runWorkers(4); }
TEST_F(HogwildTest, OneWorkerIsHogwildWithNobodyElse) { runWorkers(1); }

}  // namespace
}  // namespace cohort::train
