#include "nn/model_spec.h"

#include <gtest/gtest.h>

#include <vector>

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

TEST(ModelSpec, LenetViewsFlatRowsAsImages) {
  auto model = buildModel("cnn:lenet");
  EXPECT_EQ(model->sampleShape, (Shape{1, 28, 28}));
  EXPECT_EQ(model->outputs, 10);
  std::vector<std::pair<std::string, Shape>> want = {{"conv0.weight", Shape{6, 1, 5, 5}},  {"conv0.bias", Shape{6}},
                                                     {"conv1.weight", Shape{16, 6, 5, 5}}, {"conv1.bias", Shape{16}},
                                                     {"fc0.weight", Shape{120, 400}},      {"fc0.bias", Shape{120}},
                                                     {"fc1.weight", Shape{84, 120}},       {"fc1.bias", Shape{84}},
                                                     {"fc2.weight", Shape{10, 84}},        {"fc2.bias", Shape{10}}};
  const auto& e = model->params.entries();
  ASSERT_EQ(e.size(), want.size());
  for (size_t i = 0; i < e.size(); ++i) {
    EXPECT_EQ(e[i].name, want[i].first);
    EXPECT_EQ(e[i].shape, want[i].second) << e[i].name;
  }
  EXPECT_TRUE(model->params.bufferEntries().empty());
  EXPECT_EQ(model->net->outputShape(Shape{7, 784}), (Shape{7, 10}));
  EXPECT_EQ(model->net->outputShape(Shape{7, 1, 28, 28}), (Shape{7, 10}));
  EXPECT_THROW(model->net->outputShape(Shape{7, 3, 32, 32}), InvalidArgument);
  // It runs: a forward pass of a flat batch gives one row of logits per sample.
  model->params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(1);
  model->net->resetParams(rng);
  Pass eval;
  eval.training = false;
  EXPECT_EQ(model->net->forward(Tensor::zeros(Shape{3, 784}), eval).shape(), (Shape{3, 10}));
}

TEST(ModelSpec, LenetBnAddsBatchNormBuffers) {
  auto model = buildModel("cnn:lenet-bn");
  std::vector<std::string> buffers;
  for (const auto& e : model->params.bufferEntries()) buffers.push_back(e.name);
  EXPECT_EQ(buffers,
            (std::vector<std::string>{"bn0.running_mean", "bn0.running_var", "bn1.running_mean", "bn1.running_var"}));
  EXPECT_NE(model->params.find("bn1.weight"), nullptr);
  EXPECT_EQ(model->net->outputShape(Shape{2, 784}), (Shape{2, 10}));
}

TEST(ModelSpec, RosettaIsTheCifarCnn) {
  auto model = buildModel("cnn:rosetta");
  EXPECT_EQ(model->sampleShape, (Shape{3, 32, 32}));
  EXPECT_EQ(model->outputs, 10);
  const auto& e = model->params.entries();
  ASSERT_EQ(e.size(), 12u);
  EXPECT_EQ(e[0].name, "conv0.weight");
  EXPECT_EQ(e[0].shape, (Shape{50, 3, 3, 3}));
  EXPECT_EQ(e[6].name, "conv3.weight");
  EXPECT_EQ(e[6].shape, (Shape{100, 100, 3, 3}));
  EXPECT_EQ(e[8].name, "fc0.weight");
  EXPECT_EQ(e[8].shape, (Shape{512, 3600}));
  EXPECT_EQ(e[11].name, "fc1.bias");
  size_t count = 0;
  for (const auto& entry : e) count += entry.numel;
  EXPECT_EQ(count, 3u * 50 * 9 + 50 + 50 * 50 * 9 + 50 + 50 * 100 * 9 + 100 + 100 * 100 * 9 + 100 + 3600 * 512 + 512 +
                       512 * 10 + 10);
  EXPECT_EQ(model->net->outputShape(Shape{4, 3, 32, 32}), (Shape{4, 10}));
  EXPECT_EQ(model->net->outputShape(Shape{4, 3072}), (Shape{4, 10}));
  const std::string layers = static_cast<Sequential&>(*model->net).describe();
  for (const char* name : {"conv3 ", "pool1 ", "drop2 ", "flatten ", "fc1 "}) {
    EXPECT_NE(layers.find(name), std::string::npos) << name << " in\n" << layers;
  }
}

// gpt:...: the network is the Gpt itself, so parameter names are nanoGPT's; samples are [ctx] ids,
// outputs the vocabulary (256 unless given); keys in any order.
TEST(ModelSpec, GptIsNanoGptWithByteVocabulary) {
  auto model = buildModel("gpt:ctx=8,dim=16,heads=2,layers=2");
  EXPECT_EQ(model->sampleShape, (Shape{8}));
  EXPECT_EQ(model->outputs, 256);
  const auto& entries = model->params.entries();
  ASSERT_FALSE(entries.empty());
  EXPECT_EQ(entries.front().name, "transformer.wte.weight");
  EXPECT_EQ(entries.front().shape, (Shape{256, 16}));
  bool cAttn = false;
  for (const auto& e : entries) cAttn |= e.name == "transformer.h.1.attn.c_attn.weight" && e.shape == Shape{48, 16};
  EXPECT_TRUE(cAttn);
  EXPECT_EQ(buildModel("gpt:layers=1,heads=1,dim=8,ctx=4,vocab=11")->outputs, 11);
  for (const char* spec : {"gpt:layers=1,heads=1,dim=8", "gpt:layers=1,heads=3,dim=8,ctx=4", "gpt:layers=1,layers=2,heads=1,dim=8,ctx=4",
                           "gpt:layers=1,heads=1,dim=8,ctx=0", "gpt:layers=1,heads=1,dim=8,ctx=4,depth=3", "gpt:layers"}) {
    EXPECT_THROW(buildModel(spec), InvalidArgument) << spec;
  }
}

TEST(ModelSpec, BadSpecsAreRefusedWithTheSpecInTheMessage) {
  for (const char* spec :
       {"mlp:", "mlp:10", "mlp:10,-3", "mlp:10,x", "transformer:big", "cnn:nothing", "cnn:lenet,5"}) {
    try {
      buildModel(spec);
      ADD_FAILURE() << spec << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(spec), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("cnn:rosetta"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace cohort::nn
