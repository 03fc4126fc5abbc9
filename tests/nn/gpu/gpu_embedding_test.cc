// nn::Embedding on a GPU against the same layer on the CPU (tags = ["gpu"]; skips with the reason
// when no CUDA device is usable). The gather copies and the gradient adds positions in the same
// order on both devices, so everything is compared bit for bit: the output, the weight gradient
// overwritten (over a NaN-filled buffer) and accumulated, and the gradient of a second GPU run.
// The cases reach backward's sort with ids repeated within and across its tiles and chunks, n far
// above and far below vocab, and dim with and without float4 sums.
// Bad ids give NaN rows, are skipped by backward and are named by checkIds. The CPU layer is
// checked on its own in tests/nn/embedding_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "nn/embedding.h"
#include "runtime/error.h"
#include "runtime/random.h"
#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/gpu_context.h"
#include "tests/nn/gpu/gpu_compare.h"
#endif

namespace cohort::testing {
namespace {

#ifdef COHORT_HAVE_CUDA
using runtime::Device;
using runtime::Shape;
using runtime::Tensor;

struct EmbeddingCase {
  std::string name;
  int64_t vocab = 0, dim = 0;
  Shape ids;
  int64_t distinct = 0;  // ids drawn from [0, distinct): few distinct ids means long sums per row
};

std::ostream& operator<<(std::ostream& os, const EmbeddingCase& c) { return os << c.name; }

bool sameBits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

// A CPU and a GPU Embedding with the same table; the GPU gradient buffer starts as NaN, which an
// overwriting backward must not see.
struct Pair {
  explicit Pair(const nn::EmbeddingOptions& o, runtime::cuda::GpuContext& gpu) : cpu(o), dev(o) {
    cpu.registerParams(cpuParams, "");
    dev.registerParams(devParams, "");
    cpuParams.allocate(runtime::cpuAllocator());
    devParams.allocate(gpu.allocator());
    runtime::Rng rng(21);
    cpu.resetParams(rng);
    devParams.values().copyFrom(cpuParams.values());
    runtime::cuda::fill({devParams.grads().data(), static_cast<size_t>(devParams.numel())},
                        std::numeric_limits<float>::quiet_NaN(), gpu.stream());
  }
  nn::Embedding cpu, dev;
  nn::ParamBuffer cpuParams, devParams;
};

class GpuEmbeddingTest : public ::testing::TestWithParam<EmbeddingCase> {
 protected:
  void SetUp() override { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_P(GpuEmbeddingTest, MatchesTheCpuBitForBit) {
  const EmbeddingCase& c = GetParam();
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  Pair p({.vocab = c.vocab, .dim = c.dim}, gpu);
  runtime::Rng rng(22);
  Tensor ids = Tensor::zeros(c.ids);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.at(i) = std::floor(rng.uniform(0.0f, static_cast<float>(c.distinct)));
  const Tensor devIds = ids.clone(gpu.allocator());
  nn::Pass cpuPass, devPass;
  devPass.gpu = &gpu;

  const Tensor& yc = p.cpu.forward(ids, cpuPass);
  const Tensor& yg = p.dev.forward(devIds, devPass);
  ASSERT_TRUE(yg.device().isCuda());
  ASSERT_EQ(yg.shape(), yc.shape());
  expectClose(yc, toHost(yg, gpu), 0, "output");
  p.dev.checkIds(devPass);  // all good: no throw

  Tensor dy = Tensor::zeros(yc.shape());
  for (int64_t i = 0; i < dy.numel(); ++i) dy.at(i) = rng.uniform(-1.0f, 1.0f);
  const Tensor devDy = dy.clone(gpu.allocator());
  for (bool accumulate : {false, true}) {
    cpuPass.accumulateGrads = devPass.accumulateGrads = accumulate;
    const std::string when = accumulate ? " (accumulated)" : " (overwritten)";
    const Tensor& gc = p.cpu.backward(dy, cpuPass);
    const Tensor& gg = p.dev.backward(devDy, devPass);
    ASSERT_TRUE(gg.defined());
    ASSERT_EQ(gg.shape(), ids.shape());
    expectClose(gc, toHost(gg, gpu), 0, "input gradient (zeros)" + when);
    EXPECT_TRUE(sameBits(p.cpuParams.grads(), toHost(p.devParams.grads(), gpu))) << "weight gradient" << when;
  }

  // A second run, overwriting, gives the same bits; without an input gradient backward returns none.
  cpuPass.accumulateGrads = devPass.accumulateGrads = false;
  cpuPass.needInputGrad = devPass.needInputGrad = false;
  p.dev.forward(devIds, devPass);
  EXPECT_FALSE(p.dev.backward(devDy, devPass).defined());
  const Tensor firstRun = toHost(p.devParams.grads(), gpu);
  p.dev.forward(devIds, devPass);
  p.dev.backward(devDy, devPass);
  EXPECT_TRUE(sameBits(firstRun, toHost(p.devParams.grads(), gpu))) << "two GPU runs";
  p.cpu.backward(dy, cpuPass);
  EXPECT_TRUE(sameBits(p.cpuParams.grads(), firstRun)) << "GPU against CPU";
}

std::vector<EmbeddingCase> cases() {
  return {
      // dim % 4 == 0 takes the float4 gather, the others the scalar one.
      {"tiny", 5, 3, Shape{2, 3}, 5},
      {"float4_rows", 11, 8, Shape{3, 7}, 11},
      // More positions than one tile (256) of the backward kernel, few ids: long sums.
      {"many_positions_few_ids", 6, 5, Shape{2, 300}, 3},
      // More rows than blocks: every block owns several rows, some of which nobody uses.
      {"large_vocab", 3000, 12, Shape{4, 130}, 3000},
      {"wide_rows", 40, 300, Shape{70}, 40},
      {"scalar_ids", 9, 4, Shape{}, 9},
      {"no_ids", 7, 4, Shape{0, 5}, 7},
      // Backward's sort: n far above vocab, every id in each of 12 one-chunk tiles hundreds of
      // times; n not a multiple of the 256-position chunk; dim 7 takes the scalar sum.
      {"repeated_ids_across_tiles", 4, 7, Shape{3, 1000}, 4},
      {"repeated_ids_across_tiles_float4", 5, 12, Shape{2, 777}, 5},
      // vocab far above n (most rows absent); 2^20 rows leave room for two tiles of two chunks
      // each, so a few ids repeat across chunks of one tile and across tiles. (About 10 s on the
      // emulated device, for its 2^20 emulated threads per kernel.)
      {"huge_vocab_few_ids", 1 << 20, 4, Shape{1000}, 6},
  };
}

INSTANTIATE_TEST_SUITE_P(Embedding, GpuEmbeddingTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<EmbeddingCase>& info) { return info.param.name; });

TEST(GpuEmbedding, BadIdsGiveNanRowsAreSkippedAndNamedByCheckIds) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  Pair p({.vocab = 6, .dim = 4}, gpu);
  Tensor ids = Tensor::zeros(Shape{2, 3});
  const std::vector<float> values = {1, 5, 2.5f, 6, 1, -1};
  for (int64_t i = 0; i < 6; ++i) ids.at(i) = values[static_cast<size_t>(i)];
  const Tensor devIds = ids.clone(gpu.allocator());
  nn::Pass pass;
  pass.gpu = &gpu;
  pass.needInputGrad = false;
  const Tensor y = toHost(p.dev.forward(devIds, pass), gpu);
  for (int64_t i = 0; i < 6; ++i) {
    const bool bad = i == 2 || i == 3 || i == 5;
    for (int64_t d = 0; d < 4; ++d) {
      EXPECT_EQ(std::isnan(y.at(i * 4 + d)), bad) << "position " << i << ", column " << d;
    }
  }
  try {
    p.dev.checkIds(pass);
    ADD_FAILURE() << "bad ids were not reported";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("position 2 "), std::string::npos) << what;
    EXPECT_NE(what.find("is 2.5,"), std::string::npos) << what;
  }

  // Backward adds the good positions only (1, 5 and 1 again); rows 0, 2, 3 and 4 are zero.
  Tensor dy = Tensor::zeros(Shape{2, 3, 4});
  for (int64_t i = 0; i < dy.numel(); ++i) dy.at(i) = static_cast<float>(i % 7) - 3.0f;
  p.dev.backward(dy.clone(gpu.allocator()), pass);
  const Tensor g = toHost(p.devParams.grads(), gpu);
  for (int64_t row = 0; row < 6; ++row) {
    for (int64_t d = 0; d < 4; ++d) {
      float want = 0.0f;
      if (row == 1) want = dy.at(0 * 4 + d) + dy.at(4 * 4 + d);
      if (row == 5) want = dy.at(1 * 4 + d);
      EXPECT_EQ(g.at(row * 4 + d), want) << "row " << row << ", column " << d;
    }
  }
}
// Many positions with a bad id every few (out of range, negative, fractional, NaN) across tiles
// and chunks: backward adds the good ones in position order, as the host does here, and gives
// absent rows 0 (or leaves them, accumulating).
TEST(GpuEmbedding, BackwardSkipsBadIdsAcrossTiles) {
  COHORT_SKIP_WITHOUT_CUDA_DEVICE();
  runtime::cuda::GpuContext gpu(Device::cuda(0));
  const int64_t vocab = 9, dim = 6, n = 900;
  Pair p({.vocab = vocab, .dim = dim}, gpu);
  const std::vector<float> bad = {-1.0f, 9.0f, 2.5f, std::numeric_limits<float>::quiet_NaN(), 1e30f};
  runtime::Rng rng(23);
  Tensor ids = Tensor::zeros(Shape{n});
  for (int64_t i = 0; i < n; ++i) {
    ids.at(i) = i % 7 == 3 ? bad[static_cast<size_t>(i / 7) % bad.size()] : std::floor(rng.uniform(0.0f, 7.0f));
  }
  Tensor dy = Tensor::zeros(Shape{n, dim});
  for (int64_t i = 0; i < dy.numel(); ++i) dy.at(i) = rng.uniform(-1.0f, 1.0f);
  nn::Pass pass;
  pass.gpu = &gpu;
  pass.needInputGrad = false;
  p.dev.forward(ids.clone(gpu.allocator()), pass);
  const Tensor devDy = dy.clone(gpu.allocator());
  Tensor want = Tensor::zeros(Shape{vocab, dim});  // rows 7 and 8 never occur
  for (bool accumulate : {false, true}) {
    pass.accumulateGrads = accumulate;
    p.dev.backward(devDy, pass);
    for (int64_t i = 0; i < n; ++i) {
      if (i % 7 == 3) continue;
      const auto row = static_cast<int64_t>(ids.at(i));
      for (int64_t d = 0; d < dim; ++d) want.at(row * dim + d) += dy.at(i * dim + d);
    }
    EXPECT_TRUE(sameBits(want, toHost(p.devParams.grads(), gpu))) << (accumulate ? "accumulated" : "overwritten");
  }
}
#else
TEST(GpuEmbedding, NeedCuda) { GTEST_SKIP() << "no CUDA device: CUDA support not compiled in"; }
#endif

}  // namespace
}  // namespace cohort::testing
