#include "nn/model_spec.h"

#include <gtest/gtest.h>

#include "runtime/error.h"

namespace cohort::nn {
namespace {

TEST(ModelSpec, MlpLayoutIsOneContiguousBufferInForwardOrder) {
  auto model = buildModel("mlp:784,512,256,10");
  EXPECT_EQ(model->sampleShape, (Shape{784}));
  EXPECT_EQ(model->outputs, 10);
  const auto& e = model->params.entries();
  ASSERT_EQ(e.size(), 6u);
  EXPECT_EQ(e[0].name, "fc0.weight");
  EXPECT_EQ(e[0].shape, (Shape{512, 784}));
  EXPECT_EQ(e[5].name, "fc2.bias");
  for (size_t i = 1; i < e.size(); ++i) EXPECT_GE(e[i].offset, e[i - 1].offset + e[i - 1].numel);
  EXPECT_GE(model->params.numel(), 784u * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10);
  model->params.allocate(runtime::cpuAllocator());
  // Every parameter tensor is a view into the flat buffer.
  EXPECT_EQ(model->params.value(0).data(), model->params.values().data());
  EXPECT_EQ(model->params.grad(5).data(), model->params.grads().data() + e[5].offset);
}

TEST(ModelSpec, BadSpecsAreRefusedWithTheSpecInTheMessage) {
  for (const char* spec : {"mlp:", "mlp:10", "mlp:10,-3", "mlp:10,x", "transformer:big", "cnn:nothing"}) {
    try {
      buildModel(spec);
      ADD_FAILURE() << spec << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(spec), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace cohort::nn
