// Issue 47, item 6 on a GPU against the CPU: a GPT with a padded vocabulary (the −inf logits of
// runtime/cuda's fillColumns), no biases and dropout, trained with nanoGPT's weight-decay groups
// (one kernel per run of a group), steps as on the CPU; and a grouped optimizer's ZeRO steps
// (stepShard over a packed shard, stepPieces in place in the whole buffer) give the whole buffer's
// GPU step bit for bit. Emulated device only here (docs/gpu.md, "The emulated device").
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "nn/shard_map.h"
#include "runtime/cuda/gpu_context.h"
#include "runtime/random.h"
#include "tests/nn/gpu/gpu_compare.h"
#include "tests/nn/token_ids.h"
#include "tests/runtime/cuda/gpu_test_util.h"

namespace cohort::testing {
namespace {

using runtime::Device;
using runtime::Shape;
using runtime::Tensor;

TEST(GpuGptOptions, PaddedBiaslessDropoutGptWithGroupsStepsAsOnTheCpu) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  const std::string spec = "gpt:layers=2,heads=2,dim=16,ctx=8,vocab=37,padded_vocab=64,dropout=0.1,bias=false";
  auto cpu = nn::buildModel(spec), dev = nn::buildModel(spec);
  cpu->params.allocate(runtime::cpuAllocator());
  runtime::Rng init(7);
  cpu->net->resetParams(init);
  nn::bindOnGpu(*dev, *cpu, gpu);
  const nn::OptimizerOptions opt{.kind = nn::OptimizerKind::kAdamW, .lr = 1e-2f, .weightDecay = 0.1f,
                                 .groups = nn::decayMatricesOnly(cpu->params, 0.1f)};
  auto cpuOpt = nn::makeOptimizer(opt, cpu->params.numel()), devOpt = nn::makeOptimizer(opt, dev->params.numel(), &gpu);
  nn::SoftmaxCrossEntropy cpuLoss, devLoss;
  runtime::Rng cpuDropout(21), devDropout(21);
  Tensor x, y;
  for (int step = 0; step < 3; ++step) {
    const Tensor hx = randomTokenIds(4, 8, 37, 100 + static_cast<uint64_t>(step)), hy = randomTokenIds(4, 8, 37, 200 + static_cast<uint64_t>(step));
    x = hx.clone(gpu.allocator());
    y = hy.clone(gpu.allocator());
    nn::Pass cpuPass, devPass;
    cpuPass.rng = &cpuDropout;
    devPass.rng = &devDropout;
    devPass.gpu = &gpu;
    cpuPass.needInputGrad = devPass.needInputGrad = false;
    const Tensor& outCpu = cpu->net->forward(hx, cpuPass);
    const Tensor& outDev = dev->net->forward(x, devPass);
    expectClose(outCpu, toHost(outDev, gpu), 1e-4, "logits at step " + std::to_string(step));  // −inf equal
    const float lossCpu = cpuLoss.forward(outCpu, hy);
    devLoss.forwardGpu(outDev, y, gpu);
    EXPECT_NEAR(devLoss.takeGpuSums(gpu).loss / 4.0, lossCpu, 1e-4) << "step " << step;
    cpu->net->backward(cpuLoss.backward(), cpuPass);
    dev->net->backward(devLoss.backward(), devPass);
    cpuOpt->step(cpu->params.values(), cpu->params.grads());
    devOpt->step(dev->params.values(), dev->params.grads());
    expectClose(cpu->params.values(), toHost(dev->params.values(), gpu), 1e-4, "parameters after step " + std::to_string(step));
  }
}

TEST(GpuGptOptions, GroupedShardsStepAsTheWholeBufferBitForBit) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  const std::vector<nn::ShardMap::Unit> units = {{"a", 37}, {"b", 5}, {"c", 1100}, {"d", 3}};
  const nn::OptimizerOptions opt{.kind = nn::OptimizerKind::kAdamW, .lr = 3e-3f, .weightDecay = 0.01f,
                                 .groups = {{.begin = 3, .end = 40, .weightDecay = 0.2f},
                                            {.begin = 40, .end = 700, .weightDecay = 0.0f, .lrScale = 0.5f}}};
  const int world = 3;
  const nn::ShardMap layout(units, {.worldSize = world, .rank = 0});
  const auto n = static_cast<int64_t>(layout.numel());
  runtime::Rng rng(3);
  Tensor values = Tensor::zeros(Shape{n});
  for (int64_t i = 0; i < n; ++i) values.at(i) = rng.uniform(-2.0f, 2.0f);
  Tensor whole = values.clone(gpu.allocator()), pieces = values.clone(gpu.allocator());
  auto wholeOpt = nn::makeOptimizer(opt, layout.numel(), &gpu);
  std::vector<std::unique_ptr<nn::Optimizer>> ranks, piecesOpt;
  std::vector<nn::ShardMap> maps;
  for (int r = 0; r < world; ++r) {
    maps.emplace_back(units, nn::ShardMap::Options{.worldSize = world, .rank = r});
    ranks.push_back(nn::makeShardOptimizer(opt, maps.back(), &gpu));
    piecesOpt.push_back(nn::makeShardOptimizer(opt, maps.back(), &gpu));
  }
  // The optimizers' zero fills are enqueued on the stream, and the state blocks they freed may be
  // the ones the blocking copies below write: let the fills run first.
  gpu.stream().synchronize();
  std::vector<Tensor> hostShards, shards;
  for (int r = 0; r < world; ++r) {
    hostShards.push_back(Tensor::zeros(Shape{static_cast<int64_t>(layout.shardNumel())}));
    maps[r].pack(values.data(), r, hostShards.back().data());
    shards.push_back(hostShards.back().clone(gpu.allocator()));
  }
  for (int step = 0; step < 3; ++step) {
    Tensor g = Tensor::zeros(Shape{n});
    for (int64_t i = 0; i < n; ++i) g.at(i) = rng.uniform(-1.0f, 1.0f);
    const Tensor dg = g.clone(gpu.allocator());
    wholeOpt->step(whole, dg);
    for (int r = 0; r < world; ++r) {
      Tensor packed = Tensor::zeros(Shape{static_cast<int64_t>(layout.shardNumel())});
      maps[r].pack(g.data(), r, packed.data());
      const Tensor dpacked = packed.clone(gpu.allocator());
      ranks[r]->stepShard(shards[r], dpacked);
      piecesOpt[r]->stepPieces({.values = pieces.data(), .grads = dg.data()});
      gpu.stream().synchronize();  // before dpacked goes
    }
    const Tensor want = toHost(whole, gpu), got = toHost(pieces, gpu);
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.bytes()), 0) << "stepPieces, step " << step;
    Tensor gathered = Tensor::zeros(Shape{n});
    for (int r = 0; r < world; ++r) maps[r].unpack(toHost(shards[r], gpu).data(), r, gathered.data());
    EXPECT_EQ(std::memcmp(want.data(), gathered.data(), want.bytes()), 0) << "stepShard, step " << step;
  }
}

}  // namespace
}  // namespace cohort::testing
