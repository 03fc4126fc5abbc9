// ParamBuffer: parameter and buffer layout, binding by allocate() and attach(), name checks.
#include "nn/param_buffer.h"

#include <gtest/gtest.h>

#include <vector>

#include "runtime/error.h"

namespace cohort::nn {
namespace {

TEST(ParamBuffer, BuffersLiveInTheirOwnAlignedFlatBuffer) {
  ParamBuffer params;
  Tensor w, wGrad, mean, var, count;
  params.add("fc.weight", Shape{3, 5}, &w, &wGrad);
  EXPECT_EQ(params.addBuffer("bn.running_mean", Shape{3}, &mean), 0u);
  EXPECT_EQ(params.addBuffer("bn.running_var", Shape{3}, &var, 1.0f), 1u);
  EXPECT_EQ(params.addBuffer("empty", Shape{0}, &count, 7.0f), 2u);
  // Buffers do not count as parameters: optimizers and gradient all-reduce never see them.
  EXPECT_EQ(params.entries().size(), 1u);
  EXPECT_EQ(params.numel(), 15u);
  const auto& b = params.bufferEntries();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].offset, 0u);
  EXPECT_EQ(b[1].offset, 16u);  // each starts 64-byte aligned, like parameters
  EXPECT_EQ(b[1].numel, 3u);
  EXPECT_EQ(params.bufferNumel(), 32u);
  EXPECT_EQ(params.findBuffer("bn.running_var"), &b[1]);
  EXPECT_EQ(params.findBuffer("fc.weight"), nullptr);
  EXPECT_EQ(params.find("bn.running_var"), nullptr);

  params.allocate(runtime::cpuAllocator());
  EXPECT_EQ(params.buffers().shape(), (Shape{32}));
  EXPECT_EQ(mean.data(), params.buffers().data());
  EXPECT_EQ(var.data(), params.buffers().data() + 16);
  EXPECT_EQ(var.shape(), (Shape{3}));
  EXPECT_EQ(params.buffer(1).data(), var.data());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(mean.at(i), 0.0f);
    EXPECT_EQ(var.at(i), 1.0f);
  }
  EXPECT_NE(mean.data(), params.values().data());
}

TEST(ParamBuffer, AttachKeepsBuffersPrivate) {
  ParamBuffer params;
  Tensor w, wGrad, var;
  params.add("w", Shape{4}, &w, &wGrad);
  params.addBuffer("var", Shape{2}, &var, 1.0f);
  std::vector<float> shared(params.numel(), 0.5f);
  params.attach(shared.data(), runtime::Device::cpu(), runtime::cpuAllocator());
  EXPECT_EQ(w.data(), shared.data());
  EXPECT_TRUE(var.data() < shared.data() || var.data() >= shared.data() + shared.size());
  EXPECT_EQ(var.at(0), 1.0f);
  EXPECT_EQ(var.at(1), 1.0f);
}

TEST(ParamBuffer, ParametersAndBuffersShareOneNamespaceAndFreezeOnBinding) {
  ParamBuffer params;
  Tensor a, aGrad, b, c;
  params.add("x", Shape{2}, &a, &aGrad);
  EXPECT_THROW(params.addBuffer("x", Shape{2}, &b), InvalidArgument);
  params.addBuffer("y", Shape{2}, &b);
  EXPECT_THROW(params.addBuffer("y", Shape{2}, &c), InvalidArgument);
  EXPECT_THROW(params.add("y", Shape{2}, &c, &c), InvalidArgument);
  params.allocate(runtime::cpuAllocator());
  EXPECT_THROW(params.addBuffer("z", Shape{1}, &c), InvalidArgument);
}

TEST(ParamBuffer, AModelWithoutBuffersHasAnEmptyBufferTensor) {
  ParamBuffer params;
  Tensor w, wGrad;
  params.add("w", Shape{2}, &w, &wGrad);
  params.allocate(runtime::cpuAllocator());
  EXPECT_EQ(params.bufferNumel(), 0u);
  EXPECT_TRUE(params.bufferEntries().empty());
  EXPECT_EQ(params.buffers().numel(), 0);
}

TEST(ParamBuffer, PlaceGradsPointsEveryGradientIntoOutsideMemory) {
  ParamBuffer params;
  Tensor w, wGrad, b, bGrad;
  params.add("fc.weight", Shape{2, 3}, &w, &wGrad);
  params.add("fc.bias", Shape{2}, &b, &bGrad);
  params.allocate(runtime::cpuAllocator());
  std::vector<float> outside(params.numel(), 9.0f);
  params.placeGrads(outside.data());
  EXPECT_EQ(params.grads().data(), outside.data());
  EXPECT_EQ(wGrad.data(), outside.data());
  EXPECT_EQ(bGrad.data(), outside.data() + params.entries()[1].offset);
  EXPECT_EQ(bGrad.shape(), (Shape{2}));
  for (float v : outside) EXPECT_EQ(v, 0.0f);  // zeroed
}

}  // namespace
}  // namespace cohort::nn
