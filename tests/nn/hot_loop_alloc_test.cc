// The training hot loop (forward, loss, backward, optimizer step, next batch) allocates nothing
// once the buffers are sized for the batch shape (docs/architecture.md, "Performance principles").
// Counts calls to the global operator new in steady state, including a smaller last batch followed
// by full-size batches.
#include <gtest/gtest.h>


#include "tests/support/alloc_counter.h"
#include "nn/activation.h"
#include "nn/batchnorm.h"
#include "nn/conv2d.h"
#include "nn/dropout.h"
#include "nn/loss.h"
#include "nn/model_spec.h"
#include "nn/optimizer.h"
#include "nn/pool.h"
#include "nn/reshape.h"
#include "runtime/data/data_loader.h"
#include "runtime/data/synthetic.h"


namespace cohort::nn {
namespace {

void runSteadyState(const std::string& spec, OptimizerKind kind, float momentum) {
  auto model = buildModel(spec);
  model->params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(1);
  model->net->resetParams(rng);
  auto opt = makeOptimizer({.kind = kind, .lr = 0.01f, .momentum = momentum}, model->params.numel());
  SoftmaxCrossEntropy loss;
  // 1000 samples in batches of 64: the last batch has 40, so every epoch exercises the shrink.
  auto data = runtime::data::syntheticMnistRows(1, 1000);
  runtime::data::DataLoader loader(*data, {.batchSize = 64, .seed = 3, .prefetch = 0});
  Pass pass;
  pass.needInputGrad = false;
  auto epoch = [&](int64_t e) {
    loader.startEpoch(e);
    for (runtime::data::Batch b; loader.next(b);) {
      loss.forward(model->net->forward(b.inputs, pass), b.targets);
      model->net->backward(loss.backward(), pass);
      opt->step(model->params.values(), model->params.grads());
    }
  };
  epoch(0);  // sizes every buffer
  runtime::data::Batch b;
  loader.startEpoch(1);  // startEpoch itself may allocate (the epoch's index list)
  ASSERT_TRUE(loader.next(b));
  long before = cohort::testing::allocationCount();
  ASSERT_GT(before, 0) << "operator new is not being counted";  // building the model allocated
  int steps = 0;
  do {
    loss.forward(model->net->forward(b.inputs, pass), b.targets);
    model->net->backward(loss.backward(), pass);
    opt->step(model->params.values(), model->params.grads());
    ++steps;
  } while (loader.next(b));
  EXPECT_EQ(cohort::testing::allocationCount() - before, 0) << "allocations in " << steps << " steady-state steps";
  EXPECT_EQ(steps, 16);
}

TEST(HotLoop, SgdMomentumStepAllocatesNothing) { runSteadyState("mlp:784,64,32,10", OptimizerKind::kSgd, 0.9f); }
TEST(HotLoop, AdamStepAllocatesNothing) { runSteadyState("mlp:784,64,32,10", OptimizerKind::kAdam, 0.0f); }
// Conv2d, BatchNorm2d, MaxPool2d, Flatten and the view of flat rows as images.
TEST(HotLoop, CnnStepAllocatesNothing) { runSteadyState("cnn:lenet-bn", OptimizerKind::kSgd, 0.9f); }

TEST(HotLoop, EveryCnnLayerAllocatesNothingInSteadyState) {
  Sequential net;
  net.add(std::make_unique<Unflatten>(Shape{2, 6, 6}))
      .add(std::make_unique<Conv2d>(Conv2dOptions{.in = 2, .out = 4, .kernel = 3, .padding = 1, .tileColumns = 12}))
      .add(std::make_unique<BatchNorm2d>(4))
      .add(std::make_unique<MaxPool2d>(2))
      .add(std::make_unique<Dropout>(0.5f))
      .add(std::make_unique<Conv2d>(
          Conv2dOptions{.in = 4, .out = 4, .kernel = 2, .stride = 2, .padding = 1, .tileColumns = 18}))
      .add(std::make_unique<AvgPool2d>(2))
      .add(std::make_unique<Flatten>());
  ParamBuffer params;
  net.registerParams(params, "");
  params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(2);
  net.resetParams(rng);
  Tensor big = Tensor::zeros(Shape{8, 72}), small = Tensor::zeros(Shape{5, 72});
  Pass pass;
  pass.rng = &rng;
  net.backward(net.forward(big, pass), pass);  // sizes every buffer for the largest batch
  long before = cohort::testing::allocationCount();
  for (int i = 0; i < 4; ++i) {
    const Tensor& x = i % 2 ? small : big;
    net.backward(net.forward(x, pass), pass);
  }
  EXPECT_EQ(cohort::testing::allocationCount() - before, 0);
}

TEST(HotLoop, DropoutAndActivationsAllocateNothingInSteadyState) {
  Sequential net;
  net.add(std::make_unique<Dropout>(0.5f)).add(tanhActivation()).add(sigmoid());
  Tensor x = Tensor::zeros(Shape{32, 16});
  runtime::Rng rng(2);
  Pass pass;
  pass.rng = &rng;
  net.backward(net.forward(x, pass), pass);
  long before = cohort::testing::allocationCount();
  for (int i = 0; i < 10; ++i) net.backward(net.forward(x, pass), pass);
  EXPECT_EQ(cohort::testing::allocationCount() - before, 0);
}

}  // namespace
}  // namespace cohort::nn
