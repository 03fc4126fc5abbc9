// The parameters' bf16 copy (nn/param_buffer.h, "The bf16 copy"; tags = ["gpu"], on the emulated
// device in scripts/test): an untrusted copy is refreshed once at each bf16 Model::forward (one
// conversion, whatever the layers), so a forward sees values written straight into the device's
// value buffer; a trusted copy is read as it is (no conversion: the same write is not seen until the
// owner refreshes it); a backward with recompute converts nothing; layers called outside a Model
// convert their own entries, as before the copy existed; and the three ways give the same bits.
// Skips with the reason without a CUDA device.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "nn/gpt.h"
#include "nn/linear.h"
#include "nn/model.h"
#include "nn/sequential.h"
#include "runtime/dtype.h"
#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#include "tests/nn/gpu/gpu_compare.h"
#endif

namespace cohort::nn {
namespace {

#ifdef COHORT_HAVE_CUDA
using runtime::Device;
using runtime::DType;
using runtime::Shape;
using runtime::Tensor;
using testing::toHost;

class HalfCopyTest : public ::testing::Test {
 protected:
  void SetUp() override { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

bool sameBits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

// y = 1 · w + b through a Linear(1 -> 1) on the device, w = 1.5 and b = 0.25 (exact in bf16).
struct OneWeight {
  std::unique_ptr<Model> model;
  runtime::cuda::GpuContext& gpu;
  Tensor x;

  explicit OneWeight(runtime::cuda::GpuContext& g) : gpu(g) {
    auto net = std::make_unique<Sequential>();
    net->add(std::make_unique<Linear>(1, 1), "fc");
    model = std::make_unique<Model>(std::move(net), ModelInfo{.name = "one"});
    model->params.allocate(gpu.allocator());
    setWeight(1.5f);
    setBias(0.25f);
    Tensor one = Tensor::zeros(Shape{1, 1});
    one.at(0) = 1.0f;
    x = one.clone(gpu.allocator());
  }
  // Written straight into the device's value buffer, as another writer would.
  void setWeight(float w) { write(model->params.find("fc.weight")->offset, w); }
  void setBias(float b) { write(model->params.find("fc.bias")->offset, b); }
  void write(size_t at, float v) {
    runtime::cuda::copyToDevice(model->params.values().data() + at, &v, sizeof v, gpu.stream());
    gpu.stream().synchronize();
  }
  float forward() {
    const Pass pass{.training = false, .needInputGrad = false, .gpu = &gpu, .precision = DType::kBF16};
    return toHost(model->forward(x, pass), gpu).at(0);
  }
};

TEST_F(HalfCopyTest, AnUntrustedForwardSeesValuesWrittenOnTheDevice) {
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  OneWeight m(gpu);
  EXPECT_EQ(m.forward(), 1.75f);
  EXPECT_EQ(m.model->params.halfConversions(), 1u) << "one conversion of the whole buffer per forward";
  m.setWeight(2.5f);
  EXPECT_EQ(m.forward(), 2.75f) << "the forward read a stale bf16 copy";
  m.setBias(-1.0f);
  EXPECT_EQ(m.forward(), 1.5f);
  EXPECT_EQ(m.model->params.halfConversions(), 3u);
}

TEST_F(HalfCopyTest, ATrustedCopyIsReadAsItIsUntilItsOwnerRefreshesIt) {
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  OneWeight m(gpu);
  ParamBuffer& params = m.model->params;
  EXPECT_THROW(params.trustHalfCopy(true), InvalidArgument) << "trusted before the copy exists";
  params.makeHalfCopy(gpu.allocator());
  params.refreshHalfCopy(gpu.stream());
  params.trustHalfCopy(true);
  EXPECT_EQ(m.forward(), 1.75f);
  m.setWeight(2.5f);  // a write the owner does not know of: the trusted copy does not see it
  EXPECT_EQ(m.forward(), 1.75f) << "a trusted forward converted the values";
  EXPECT_EQ(params.halfConversions(), 1u);
  params.refreshHalfCopy(gpu.stream());  // what the owner does after its own writes
  EXPECT_EQ(m.forward(), 2.75f);
  params.trustHalfCopy(false);
  m.setWeight(0.5f);
  EXPECT_EQ(m.forward(), 0.75f) << "untrusted again: each forward refreshes";
  EXPECT_EQ(params.halfConversions(), 3u);
}

// The first element of a bf16 tensor on the device, widened.
float firstBf16(const Tensor& t, runtime::cuda::GpuContext& gpu) {
  const Tensor host = toHost(t, gpu);
  EXPECT_EQ(host.dtype(), DType::kBF16);
  return runtime::toFloat(runtime::Bf16{host.data<uint16_t>()[0]});
}

// A layer called outside a Model converts its own entries (weight and bias: two kernels) into the
// copy; the values it computes with are the ones a Model's whole refresh gives.
TEST_F(HalfCopyTest, ALayerOutsideAModelConvertsItsOwnEntries) {
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  OneWeight m(gpu);
  const Pass pass{.training = false, .needInputGrad = false, .gpu = &gpu, .precision = DType::kBF16};
  EXPECT_EQ(firstBf16(m.model->net->forward(m.x, pass), gpu), 1.75f);
  EXPECT_EQ(m.model->params.halfConversions(), 2u);
  m.setWeight(2.5f);
  EXPECT_EQ(firstBf16(m.model->net->forward(m.x, pass), gpu), 2.75f);
  EXPECT_EQ(m.model->params.halfConversions(), 4u);
}

// A bf16 GPT with full recompute, one training pass through the Model (one conversion: the
// recomputed forwards of backward read what the forward read) against the same GPT's layers called
// directly (each converts its own entries): the same logits and gradients, bit for bit.
TEST_F(HalfCopyTest, AGptPassThroughTheModelConvertsOnceAndComputesTheSameBits) {
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  const GptOptions o{.vocab = 11, .layers = 2, .heads = 2, .dim = 8, .context = 6, .recompute = RecomputeMode::kFull};
  Model viaModel(std::make_unique<Gpt>(o), {.name = "gpt"});
  Model direct(std::make_unique<Gpt>(o), {.name = "gpt"});
  for (Model* m : {&viaModel, &direct}) {
    runtime::Rng rng(3);
    m->params.allocate(runtime::cpuAllocator());
    m->net->resetParams(rng);
    m->params.relocate({.device = gpu.device(), .allocator = &gpu.allocator()});
  }
  Tensor ids = Tensor::zeros(Shape{2, 6});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.at(i) = static_cast<float>((i * 7) % 11);
  const Tensor x = ids.clone(gpu.allocator());
  const Pass pass{.training = true, .gpu = &gpu, .precision = DType::kBF16};
  const Tensor logitsA = toHost(viaModel.forward(x, pass, true), gpu);
  const Tensor logitsB = toHost(direct.net->forward(x, pass), gpu);
  ASSERT_EQ(logitsA.dtype(), DType::kBF16);
  EXPECT_TRUE(sameBits(logitsA, logitsB));
  Tensor g = Tensor::zeros(Shape{2, 6, 11});
  for (int64_t k = 0; k < g.numel(); ++k) g.at(k) = static_cast<float>(k % 5) * 1e-2f - 0.02f;
  const Tensor dy = g.clone(gpu.allocator());
  const uint64_t before = viaModel.params.halfConversions();
  viaModel.backward(dy, pass);
  direct.net->backward(dy, pass);
  EXPECT_EQ(before, 1u);
  EXPECT_EQ(viaModel.params.halfConversions(), 1u) << "backward's recomputed forwards converted";
  EXPECT_GT(direct.params.halfConversions(), 2u);
  EXPECT_TRUE(sameBits(toHost(viaModel.params.grads(), gpu), toHost(direct.params.grads(), gpu)));
}

#else
TEST(HalfCopy, NeedCuda) { GTEST_SKIP() << "no CUDA device: CUDA support not compiled in"; }
#endif

}  // namespace
}  // namespace cohort::nn
