// judgeStep (runtime/cuda/step_guard.h) against the host's formulas (tags = ["gpu"]): the norm is
// gradScale x sqrt(sum) in double, the multiplier gradScale x nn::clipCoefficient bit for bit, a
// non-finite sum or loss is never applied, the skips are counted and the one beyond the limit halts
// the guard until it is seeded again; a spike is skipped and counts against nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "nn/grad_norm.h"
#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/step_guard.h"
#include "runtime/stream.h"

namespace cohort::runtime::cuda {
namespace {

// The guard's device memory: the sum, the state and the record in one allocation.
struct DeviceGuard {
  double sum;
  StepGuardState state;
  StepRecord record;
  JudgeOptions options;  // written by storeOnDevice, read by the judge through its pointer
};

class StepGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    COHORT_SKIP_WITHOUT_CUDA_DEVICE();
    stream_ = std::make_unique<Stream>(Device::cuda(0), StreamOptions{.name = "guard"});
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&device_), sizeof(DeviceGuard)), cudaSuccess);
  }
  void TearDown() override {
    if (device_) cudaFree(device_);
  }
  // Judges one step of gradient sum `sum`; returns what the device decided.
  DeviceGuard judge(double sum, const JudgeOptions& o) {
    auto native = static_cast<cudaStream_t>(stream_->native());
    EXPECT_EQ(cudaMemcpyAsync(&device_->sum, &sum, sizeof sum, cudaMemcpyHostToDevice, native), cudaSuccess);
    storeOnDevice(&device_->options, o, *stream_);
    judgeStep(&device_->sum, &device_->options, &device_->state, &device_->record, *stream_);
    DeviceGuard host;
    EXPECT_EQ(cudaMemcpyAsync(&host, device_, sizeof host, cudaMemcpyDeviceToHost, native), cudaSuccess);
    stream_->synchronize(std::chrono::seconds(10));
    return host;
  }
  std::unique_ptr<Stream> stream_;
  DeviceGuard* device_ = nullptr;
};

bool sameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Sums whose norms fall below, at and above the clip bound, odd ones that round in float, and
// micro-batch scales: the multiplier is the host's bit for bit.
TEST_F(StepGuardTest, ClipsExactlyAsTheHostFormula) {
  const std::vector<double> sums = {0.0, 1e-12, 0.0625, 0.24999, 0.25, 0.2500001, 1.0, 2.0, 3.14159, 17.3, 1e6, 4.2e30};
  for (const float scale : {1.0f, 0.5f, 1.0f / 3.0f}) {
    for (const float maxNorm : {0.0f, 0.5f, 1.0f, 0.3f}) {
      for (const double sum : sums) {
        const DeviceGuard g = judge(sum, {.gradScale = scale, .clipGradNorm = maxNorm, .seed = 1, .seedApplied = 7});
        const double norm = static_cast<double>(scale) * std::sqrt(sum);
        const float clip = maxNorm > 0 ? nn::clipCoefficient(norm, maxNorm) : 1.0f;
        EXPECT_EQ(g.record.gradNorm, norm) << "sum " << sum;
        EXPECT_TRUE(sameBits(g.state.control.gradMultiplier, scale * clip))
            << "sum " << sum << " scale " << scale << " max " << maxNorm << ": device "
            << g.state.control.gradMultiplier << ", host " << scale * clip;
        EXPECT_EQ(g.state.control.apply, 1);
        EXPECT_EQ(g.state.control.appliedBefore, 7);
        EXPECT_EQ(g.record.appliedSteps, 8);
      }
    }
  }
}

// Limit 1: the first non-finite step is skipped, the second halts the guard; a halted guard applies
// nothing, finite or not, until a seed clears it.
TEST_F(StepGuardTest, CountsSkipsAndHaltsBeyondTheLimit) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  struct Step {
    double sum;
    int lossNonFinite, seed;
    int applied, nonFinite, halted;
    long long appliedSteps;
  };
  const std::vector<Step> steps = {
      {1.0, 0, 1, 1, 0, 0, 1}, {nan, 0, 0, 0, 2, 0, 1}, {4.0, 0, 0, 1, 0, 0, 2},
      {1.0, 1, 0, 0, 1, 1, 2}, {1.0, 0, 0, 0, 0, 1, 2}, {inf, 0, 0, 0, 2, 1, 2},
      {1.0, 0, 1, 1, 0, 0, 1},  // seeded with 0 applied steps: the halt is cleared
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    const DeviceGuard g =
        judge(s.sum, {.lossNonFinite = s.lossNonFinite, .nonFiniteLimit = 1, .seed = s.seed, .seedApplied = 0});
    EXPECT_EQ(g.record.applied, s.applied) << "step " << i;
    EXPECT_EQ(g.state.control.apply, s.applied) << "step " << i;
    EXPECT_EQ(g.record.nonFinite, s.nonFinite) << "step " << i;
    EXPECT_EQ(g.record.halted, s.halted) << "step " << i;
    EXPECT_EQ(g.record.appliedSteps, s.appliedSteps) << "step " << i;
  }
}

// The spike rule (train/step.h, "Spikes"): a finite norm above maxGradNorm, or a loss the host found
// spiking, is not applied, counts against no skip and never halts; a non-finite step outranks it.
TEST_F(StepGuardTest, SkipsSpikesWithoutCountingThem) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Step {
    double sum;  // the norm is its square root: 2 is the limit
    int lossSpike, lossNonFinite, seed;
    int applied, nonFinite, spike;
    long long appliedSteps, nonFiniteSteps;
  };
  const std::vector<Step> steps = {
      {4.0, 0, 0, 1, 1, 0, 0, 1, 0},   // at the limit: applied
      {4.5, 0, 0, 0, 0, 0, 2, 1, 0},   // above it: a gradient spike
      {1.0, 1, 0, 0, 0, 0, 1, 1, 0},   // the host's loss spike
      {nan, 1, 0, 0, 0, 2, 0, 1, 1},   // non-finite outranks the spike, and counts
      {1e6, 0, 1, 0, 0, 1, 0, 1, 2},   // a non-finite loss too: the guard halts (limit 1)
      {1.0, 0, 0, 0, 0, 0, 0, 1, 2},   // halted: nothing applied, no spike said
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    const DeviceGuard g = judge(s.sum, {.lossNonFinite = s.lossNonFinite,
                                        .lossSpike = s.lossSpike,
                                        .maxGradNorm = 2.0,
                                        .nonFiniteLimit = 1,
                                        .seed = s.seed,
                                        .seedApplied = 0});
    EXPECT_EQ(g.record.applied, s.applied) << "step " << i;
    EXPECT_EQ(g.state.control.apply, s.applied) << "step " << i;
    EXPECT_EQ(g.record.nonFinite, s.nonFinite) << "step " << i;
    EXPECT_EQ(g.record.spike, s.spike) << "step " << i;
    EXPECT_EQ(g.record.appliedSteps, s.appliedSteps) << "step " << i;
    EXPECT_EQ(g.record.nonFiniteSteps, s.nonFiniteSteps) << "step " << i;
  }
}

}  // namespace
}  // namespace cohort::runtime::cuda
#endif
