// The GPT's gradient buckets all-reduced while backward goes on, over NCCL (tags = ["gpu"]; on the
// emulated device in CI, whose streams run their operations after random delays): two ranks train a
// GPT with the pass's unit listener (each bucket starts as soon as backward has enqueued the kernels
// of its units, ordered after them by an event) and without it (every bucket starts after
// backward); all four replicas end bit for bit alike. A bucket read before the kernels that write
// it had run would leave the overlapped ranks elsewhere. The parent never touches CUDA (a process
// that forks after initialising CUDA leaves its children unable to use it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "runtime/cuda/gpu_context.h"
#include "runtime/device_query.h"
#include "tests/ipc/multiproc.h"
#include "tests/support/float_file.h"
#include "train/job.h"

namespace cohort::train {
namespace {

using runtime::Shape;
using runtime::Tensor;

constexpr int kTooFewDevices = 77;  // a rank's exit code: fewer than two CUDA devices (the parent skips)

// Two blocks of width 128: 1.6 MB of gradients, two buckets (the first, up to 1 MiB, holds ln_f and
// the last block), so the first bucket's all-reduce runs beside the first block's backward.
constexpr char kModel[] = "gpt:layers=2,heads=2,dim=128,ctx=8,vocab=32";

// Token ids of (rank, step) as a [2, 8] batch on the host: each rank trains on its own.
Tensor ids(int rank, int step) {
  Tensor t = Tensor::zeros(Shape{2, 8});
  for (int64_t i = 0; i < t.numel(); ++i) t.at(i) = static_cast<float>((i * 7 + rank * 5 + step * 3) % 32);
  return t;
}

constexpr int kSteps = 6;

// One rank: kSteps AdamW steps, then its parameters into `path`.
int trainRank(const runtime::WorldInfo& world, const std::string& path, bool overlap) {
  if (runtime::cudaDevices().size() < 2) return kTooFewDevices;
  Job job({.mode = Mode::kAllReduce, .device = "cuda"}, world);
  auto model = nn::buildModel(kModel);
  auto optimizer =
      nn::makeOptimizer({.kind = nn::OptimizerKind::kAdamW, .lr = 0.01f}, model->params.numel(), job.gpu());
  job.place(*model, *optimizer, {.seed = 1});
  nn::SoftmaxCrossEntropy loss;
  // Every batch is copied to the device before any kernel runs: a copy to the GPU is a blocking
  // cudaMemcpy that the compute stream's work does not wait for (Tensor::copyFrom).
  std::vector<Tensor> batches;
  for (int step = 0; step <= kSteps; ++step) batches.push_back(ids(world.rank, step).clone(job.gpu()->allocator()));
  for (int step = 0; step < kSteps; ++step) {
    const Tensor& x = batches[static_cast<size_t>(step)];
    const Tensor& y = batches[static_cast<size_t>(step) + 1];
    nn::Pass pass = job.pass();
    if (!overlap) pass.units = nullptr;  // GradSync then starts every bucket in step()
    loss.forwardGpu(model->forward(x, pass), y, *job.gpu());
    model->net->backward(loss.backward(), pass);
    if (!job.step().applied) return 2;
  }
  job.gpu()->stream().synchronize();  // the last update's kernels, before the blocking copy reads
  Tensor host = Tensor::zeros(model->params.values().shape());
  host.copyFrom(model->params.values());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(host.data()), static_cast<std::streamsize>(host.numel() * sizeof(float)));
  return out.good() ? 0 : 1;
}

using cohort::testing::readFloats;

// How many values differ in their bits, and the first one that does ("none").
std::string difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " values";
  size_t differ = 0, first = a.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
    ++differ;
    first = std::min(first, i);
  }
  if (differ == 0) return "none";
  return std::to_string(differ) + " of " + std::to_string(a.size()) + " values, the first at " + std::to_string(first) +
         ": " + std::to_string(a[first]) + " vs " + std::to_string(b[first]);
}

TEST(GptOverlapGpu, BucketsAllReducedDuringBackwardEndWhereBucketsAfterBackwardEnd) {
  ipc::testing::ScopedShmDir shm;
  const std::string dir = shm.path();
  for (const bool overlap : {true, false}) {
    const std::string jobId = ipc::testing::freshJobId();
    std::vector<pid_t> children;
    for (int r = 0; r < 2; ++r) {
      const runtime::WorldInfo world{
          .rank = r, .worldSize = 2, .localRank = r, .localWorldSize = 2, .jobId = jobId, .source = "test"};
      const std::string path = dir + (overlap ? "/on-rank" : "/off-rank") + std::to_string(r) + ".bin";
      children.push_back(ipc::testing::forkChild([=] { return trainRank(world, path, overlap); }));
    }
    std::vector<int> codes;
    for (pid_t child : children) codes.push_back(ipc::testing::waitChild(child, std::chrono::seconds(240)));
    if (codes[0] == kTooFewDevices) GTEST_SKIP() << "needs 2 CUDA devices";
    ASSERT_EQ(codes[0], 0) << "overlap " << overlap;
    ASSERT_EQ(codes[1], 0) << "overlap " << overlap;
  }
  const std::vector<float> on0 = readFloats(dir + "/on-rank0.bin"), on1 = readFloats(dir + "/on-rank1.bin");
  const std::vector<float> off0 = readFloats(dir + "/off-rank0.bin"), off1 = readFloats(dir + "/off-rank1.bin");
  ASSERT_GT(on0.size(), 0u);
  EXPECT_EQ(difference(off0, off1), "none") << "the replicas without overlap";
  EXPECT_EQ(difference(on0, on1), "none") << "the replicas with overlap";
  EXPECT_EQ(difference(on0, off0), "none") << "with overlap against without";
}

}  // namespace
}  // namespace cohort::train
