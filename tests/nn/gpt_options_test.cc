// The GPT options a ported nanoGPT or llm.c recipe sets (issue 47, item 6), through the gpt: spec:
//   - padded_vocab: the padded ids' logits are −inf, so the loss, its gradient and the accuracy
//     equal the unpadded model's exactly (the same weights in the real rows) over several steps;
//   - dropout: the same seed draws the same masks (two runs bit for bit), another seed others;
//     evaluation is the identity; recompute is refused with it;
//   - bias=false: no bias parameters (nanoGPT's bias=False), the gradients of the model whose
//     biases are all zero bit for bit, training lowers the loss;
//     HuggingFace's and llm.c's GPT-2 files refuse it, both ways;
//   - the spec's keys: refused values name the key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/gpt_files.h"
#include "nn/loss.h"
#include "nn/model.h"
#include "nn/model_spec.h"
#include "nn/model_weights.h"
#include "nn/optimizer.h"
#include "runtime/error.h"
#include "runtime/random.h"
#include "tests/nn/token_ids.h"

namespace cohort::nn::testing {
namespace {

using runtime::Shape;
using runtime::Tensor;

using cohort::testing::randomTokenIds;

std::unique_ptr<Model> bound(const std::string& spec, uint64_t seed) {
  auto model = buildModel(spec);
  model->params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(seed);
  model->net->resetParams(rng);
  return model;
}

bool sameBits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

struct Trained {
  std::vector<float> losses;
  std::vector<int64_t> correct;
};

// `steps` AdamW steps (nanoGPT's groups) on fixed random batches, `batches` of them in turn (random
// targets: the loss falls only by memorising them); `dropoutSeed` seeds the masks.
Trained train(Model& model, int64_t vocab, int steps, uint64_t dropoutSeed, int batches = 1000) {
  SoftmaxCrossEntropy loss;
  auto optimizer = makeOptimizer({.kind = OptimizerKind::kAdamW, .lr = 1e-2f, .weightDecay = 0.1f,
                                  .groups = decayMatricesOnly(model.params, 0.1f)},
                                 model.params.numel());
  runtime::Rng rng(dropoutSeed);
  Pass pass;
  pass.rng = &rng;
  Trained out;
  for (int s = 0; s < steps; ++s) {
    const auto batch = static_cast<uint64_t>(s % batches);
    const Tensor x = randomTokenIds(3, 8, vocab, 100 + batch), y = randomTokenIds(3, 8, vocab, 200 + batch);
    model.params.zeroGrads();
    out.losses.push_back(loss.forward(model.forward(x, pass), y));
    out.correct.push_back(loss.correct());
    model.backward(loss.backward(), pass);
    optimizer->step(model.params.values(), model.params.grads());
  }
  return out;
}

TEST(GptPaddedVocab, LossAndTrainingEqualTheUnpaddedModelsExactly) {
  auto plain = bound("gpt:layers=2,heads=2,dim=16,ctx=8,vocab=37", 3);
  auto padded = buildModel("gpt:layers=2,heads=2,dim=16,ctx=8,vocab=37,padded_vocab=64");
  padded->params.allocate(runtime::cpuAllocator());
  ASSERT_EQ(padded->outputs, 64);
  // The same weights; the padded rows of wte random too (they must not matter).
  runtime::Rng rng(9);
  for (int64_t i = 0; i < padded->params.values().numel(); ++i) padded->params.values().at(i) = rng.uniform(-1.0f, 1.0f);
  for (size_t e = 0; e < plain->params.entries().size(); ++e) {
    const Tensor from = plain->params.value(e), to = padded->params.value(e);
    std::memcpy(to.data(), from.data(), from.bytes());  // wte: the first 37 rows
  }
  const Trained a = train(*plain, 37, 4, 1), b = train(*padded, 37, 4, 1);
  for (size_t s = 0; s < a.losses.size(); ++s) {
    EXPECT_EQ(a.losses[s], b.losses[s]) << "step " << s;  // exactly
    EXPECT_EQ(a.correct[s], b.correct[s]) << "step " << s;
  }
  for (size_t e = 1; e < plain->params.entries().size(); ++e) {
    EXPECT_TRUE(sameBits(plain->params.value(e), padded->params.value(e))) << plain->params.entries()[e].name;
  }
  EXPECT_EQ(std::memcmp(plain->params.value(0).data(), padded->params.value(0).data(), plain->params.value(0).bytes()), 0)
      << "wte's real rows";
  // The padded ids' logits are −inf; a padded row of wte got no gradient.
  Pass eval;
  eval.training = false;
  const Tensor& logits = padded->forward(randomTokenIds(1, 8, 37, 5), eval);
  for (int64_t t = 0; t < 8; ++t) {
    EXPECT_TRUE(std::isfinite(logits.at(t * 64 + 36)));
    EXPECT_EQ(logits.at(t * 64 + 37), -INFINITY);
    EXPECT_EQ(logits.at(t * 64 + 63), -INFINITY);
  }
  // The padded columns' probabilities are 0 but for the vectorised exp's subnormal of −inf.
  EXPECT_LT(std::fabs(padded->params.grad(0).at(40 * 16)), 1e-37f);
}

TEST(GptDropout, TheSameSeedDrawsTheSameMasks) {
  const std::string spec = "gpt:layers=2,heads=2,dim=16,ctx=8,vocab=29,dropout=0.25";
  auto a = bound(spec, 4), b = bound(spec, 4), c = bound(spec, 4);
  const Trained ra = train(*a, 29, 3, 7), rb = train(*b, 29, 3, 7), rc = train(*c, 29, 3, 8);
  EXPECT_EQ(ra.losses, rb.losses);
  EXPECT_TRUE(sameBits(a->params.values(), b->params.values()));
  EXPECT_NE(ra.losses[0], rc.losses[0]);  // another seed, other masks
  // Evaluation is the identity: the model without dropout, of the same weights, gives the same logits.
  auto none = bound("gpt:layers=2,heads=2,dim=16,ctx=8,vocab=29", 4);
  none->params.values().copyFrom(a->params.values());
  Pass eval;
  eval.training = false;
  const Tensor x = randomTokenIds(2, 8, 29, 3);
  EXPECT_TRUE(sameBits(a->forward(x, eval), none->forward(x, eval)));
  EXPECT_THROW(Gpt({.vocab = 29, .layers = 1, .heads = 1, .dim = 8, .context = 8, .recompute = RecomputeMode::kFull,
                    .dropout = 0.1f}),
               InvalidArgument);
}

TEST(GptBias, WithoutBiasesHasNoBiasParametersAndTrains) {
  auto model = bound("gpt:layers=2,heads=2,dim=16,ctx=8,vocab=29,bias=false", 6);
  for (const auto& e : model->params.entries()) EXPECT_EQ(e.name.find("bias"), std::string::npos) << e.name;
  EXPECT_EQ(model->params.entries().size(), 2u + 2 * 6 + 1);  // wte, wpe; per block 2 LN + 4 Linear weights; ln_f
  const Trained t = train(*model, 29, 30, 1, 1);
  EXPECT_LT(t.losses.back(), t.losses.front() - 0.5f);
  // Its gradients are those of the model with biases that are all zero, bit for bit (x + 0 = x).
  auto zeroBiases = bound("gpt:layers=2,heads=2,dim=16,ctx=8,vocab=29", 6);
  for (const auto& e : zeroBiases->params.entries()) {
    const ParamBuffer::Entry* same = model->params.find(e.name);
    const Tensor to = zeroBiases->params.value(static_cast<size_t>(&e - zeroBiases->params.entries().data()));
    if (same) {
      std::memcpy(to.data(), model->params.values().data() + same->offset, to.bytes());
    } else {
      to.fill(0.0f);
    }
  }
  SoftmaxCrossEntropy loss;
  Pass pass;
  const Tensor x = randomTokenIds(2, 8, 29, 1), y = randomTokenIds(2, 8, 29, 2);
  for (Model* m : {model.get(), zeroBiases.get()}) {
    m->params.zeroGrads();
    loss.forward(m->forward(x, pass), y);
    m->backward(loss.backward(), pass);
  }
  for (const auto& e : model->params.entries()) {
    const ParamBuffer::Entry* other = zeroBiases->params.find(e.name);
    ASSERT_NE(other, nullptr) << e.name;
    EXPECT_EQ(std::memcmp(model->params.grads().data() + e.offset, zeroBiases->params.grads().data() + other->offset,
                          e.numel * sizeof(float)),
              0)
        << e.name;
  }
}

// GPT-2's files hold biases: a model without them neither writes those files nor takes their weights.
TEST(GptBias, WeightFilesOfGpt2RefuseAModelWithoutBiases) {
  auto model = bound("gpt:layers=1,heads=1,dim=8,ctx=8,vocab=29,bias=false", 6);
  const GptOptions& o = dynamic_cast<const Gpt&>(*model->net).options();
  std::vector<NamedTensor> tensors;
  for (size_t e = 0; e < model->params.entries().size(); ++e) {
    tensors.push_back({model->params.entries()[e].name, model->params.value(e)});
  }
  const std::string dir = ::testing::TempDir();
  EXPECT_THROW(writeHuggingFaceGpt(dir + "/hf.safetensors", o, tensors), InvalidArgument);
  EXPECT_THROW(writeLlmcGpt(dir + "/gpt2.bin", o, tensors, runtime::DType::kF32), InvalidArgument);
  tensors.push_back({"transformer.h.0.ln_1.bias", Tensor::zeros(Shape{8})});
  const ModelWeights withBiases{.path = "gpt2.bin", .format = "llm.c (fp32)", .tensors = tensors};
  try {
    checkWeightsFit(*model, withBiases);
    ADD_FAILURE() << "a file with biases fitted a model without them";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("holds 'transformer.h.0.ln_1.bias'"), std::string::npos) << e.what();
  }
}

TEST(GptSpec, RefusesBadValuesNamingTheKey) {
  for (const char* bad : {"gpt:layers=1,heads=1,dim=8,ctx=8,dropout=1", "gpt:layers=1,heads=1,dim=8,ctx=8,dropout=-0.1",
                          "gpt:layers=1,heads=1,dim=8,ctx=8,bias=maybe", "gpt:layers=1,heads=1,dim=8,ctx=8,vocab=300,padded_vocab=256",
                          "gpt:layers=1,heads=1,dim=8,ctx=8,bias=true,bias=false"}) {
    EXPECT_THROW(buildModel(bad), InvalidArgument) << bad;
  }
  EXPECT_NO_THROW(buildModel("gpt:layers=1,heads=1,dim=8,ctx=8,vocab=300,padded_vocab=300"));
}

}  // namespace
}  // namespace cohort::nn::testing
