// CausalSelfAttention on the CPU (issue 20): gradients against finite differences (T = 1, odd T,
// one head and several), the causal mask exact (changing a later token never changes an earlier
// output, bit for bit), the output against a direct per-element computation of the same formula,
// probabilities that sum to 1 over the visible positions and are 0 beyond, and bad shapes refused;
// TransformerBlock: gradients against finite differences, nanoGPT's parameter names and shapes, and
// its output against its parts composed by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "nn/attention.h"
#include "nn/transformer_block.h"
#include "runtime/error.h"
#include "tests/nn/grad_check.h"

namespace cohort::nn::testing {
namespace {

using runtime::Shape;
using runtime::Tensor;

struct Case {
  int64_t batch, time, dim, heads;
};

class AttentionGradients : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionGradients, MatchFiniteDifferences) {
  const Case c = GetParam();
  CausalSelfAttention m({.dim = c.dim, .heads = c.heads});
  ParamBuffer params;
  bindParams(m, params, 3);
  checkModuleGradients(m, params, randomTensor(Shape{c.batch, c.time, c.dim}, 4));
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionGradients,
                         ::testing::Values(Case{2, 1, 4, 1}, Case{2, 1, 6, 3}, Case{1, 5, 4, 1}, Case{2, 5, 6, 2},
                                           Case{1, 8, 8, 4}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return "b" + std::to_string(info.param.batch) + "_t" + std::to_string(info.param.time) +
                                  "_d" + std::to_string(info.param.dim) + "_h" + std::to_string(info.param.heads);
                         });

// Changing the input at position s changes no output at positions before s, in any batch row.
TEST(Attention, TheCausalMaskIsExact) {
  const int64_t B = 2, T = 9, D = 8;
  CausalSelfAttention m({.dim = D, .heads = 2});
  ParamBuffer params;
  bindParams(m, params, 5);
  Tensor x = randomTensor(Shape{B, T, D}, 6);
  Pass pass;
  const Tensor before = m.forward(x, pass).clone();
  for (int64_t s = 0; s < T; ++s) {
    Tensor changed = x.clone();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t d = 0; d < D; ++d) changed.at((b * T + s) * D + d) += 0.5f + 0.1f * static_cast<float>(d);
    }
    const Tensor& after = m.forward(changed, pass);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        bool same = true;
        for (int64_t d = 0; d < D; ++d) same = same && after.at((b * T + t) * D + d) == before.at((b * T + t) * D + d);
        if (t < s) {
          EXPECT_TRUE(same) << "changing position " << s << " changed the output at position " << t << " (batch " << b << ")";
        } else {
          EXPECT_FALSE(same) << "changing position " << s << " left position " << t << " unchanged (batch " << b << ")";
        }
      }
    }
  }
}

// The output equals the formula evaluated element by element, in double.
TEST(Attention, OutputMatchesADirectComputation) {
  const int64_t B = 2, T = 6, D = 6, H = 3, hd = D / H;
  CausalSelfAttention m({.dim = D, .heads = H});
  ParamBuffer params;
  bindParams(m, params, 7);
  Tensor x = randomTensor(Shape{B, T, D}, 8);
  Pass pass;
  const Tensor& y = m.forward(x, pass);
  const Tensor& wa = m.cAttn().weight();
  const Tensor& ba = m.cAttn().bias();
  const Tensor& wp = m.cProj().weight();
  const Tensor& bp = m.cProj().bias();
  for (int64_t b = 0; b < B; ++b) {
    // qkv[t][j] = x[t] · wa[j] + ba[j]
    std::vector<double> qkv(static_cast<size_t>(T * 3 * D));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < 3 * D; ++j) {
        double s = ba.at(j);
        for (int64_t i = 0; i < D; ++i) s += static_cast<double>(x.at((b * T + t) * D + i)) * wa.at(j * D + i);
        qkv[static_cast<size_t>(t * 3 * D + j)] = s;
      }
    }
    std::vector<double> heads(static_cast<size_t>(T * D));
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> w(static_cast<size_t>(t + 1));
        double mx = -1e300, sum = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double s = 0;
          for (int64_t e = 0; e < hd; ++e) s += qkv[t * 3 * D + h * hd + e] * qkv[u * 3 * D + D + h * hd + e];
          w[static_cast<size_t>(u)] = s / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, w[static_cast<size_t>(u)]);
        }
        for (auto& v : w) sum += (v = std::exp(v - mx));
        for (int64_t e = 0; e < hd; ++e) {
          double o = 0;
          for (int64_t u = 0; u <= t; ++u) o += w[static_cast<size_t>(u)] / sum * qkv[u * 3 * D + 2 * D + h * hd + e];
          heads[static_cast<size_t>(t * D + h * hd + e)] = o;
        }
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < D; ++j) {
        double s = bp.at(j);
        for (int64_t i = 0; i < D; ++i) s += heads[static_cast<size_t>(t * D + i)] * wp.at(j * D + i);
        EXPECT_NEAR(y.at((b * T + t) * D + j), s, 1e-5 * std::max(1.0, std::abs(s))) << "b " << b << " t " << t << " j " << j;
      }
    }
  }
}

TEST(Attention, ProbabilitiesSumToOneOverTheVisiblePositionsAndAreZeroBeyond) {
  const int64_t B = 2, T = 7, D = 8, H = 4;
  CausalSelfAttention m({.dim = D, .heads = H});
  ParamBuffer params;
  bindParams(m, params, 9);
  Pass pass;
  m.forward(randomTensor(Shape{B, T, D}, 10), pass);
  const Tensor& p = m.probabilities();
  ASSERT_EQ(p.shape(), (Shape{B, H, T, T}));
  for (int64_t row = 0; row < B * H * T; ++row) {
    const int64_t t = row % T;
    double sum = 0;
    for (int64_t u = 0; u < T; ++u) {
      const float v = p.at(row * T + u);
      if (u > t) {
        EXPECT_EQ(v, 0.0f) << "row " << row << " position " << u;
      } else {
        EXPECT_GT(v, 0.0f);
      }
      sum += v;
    }
    EXPECT_NEAR(sum, 1.0, 1e-6) << "row " << row;
  }
}

TEST(Attention, BadShapesAreRefused) {
  EXPECT_THROW(CausalSelfAttention({.dim = 6, .heads = 4}), InvalidArgument);
  EXPECT_THROW(CausalSelfAttention({.dim = 0, .heads = 1}), InvalidArgument);
  CausalSelfAttention m({.dim = 4, .heads = 2});
  EXPECT_THROW(m.outputShape(Shape{2, 4}), InvalidArgument);
  EXPECT_THROW(m.outputShape(Shape{2, 3, 5}), InvalidArgument);
  EXPECT_THROW(m.outputShape(Shape{2, 0, 4}), InvalidArgument);
  EXPECT_EQ(m.outputShape(Shape{2, 3, 4}), (Shape{2, 3, 4}));
}

TEST(TransformerBlock, GradientsMatchFiniteDifferences) {
  for (const Case& c : {Case{2, 1, 4, 2}, Case{2, 5, 4, 1}, Case{1, 6, 6, 3}}) {
    TransformerBlock m({.dim = c.dim, .heads = c.heads});
    ParamBuffer params;
    bindParams(m, params, 11);
    // LayerNorm's defaults (1, 0) moved so that every parameter matters.
    runtime::Rng rng(12);
    for (int64_t i = 0; i < params.values().numel(); ++i) params.values().at(i) += rng.uniform(-0.2f, 0.2f);
    SCOPED_TRACE("t " + std::to_string(c.time) + " heads " + std::to_string(c.heads));
    checkModuleGradients(m, params, randomTensor(Shape{c.batch, c.time, c.dim}, 13));
  }
}

TEST(TransformerBlock, HasNanoGptsParameterNamesAndShapes) {
  const int64_t D = 8;
  TransformerBlock m({.dim = D, .heads = 2});
  ParamBuffer params;
  m.registerParams(params, "transformer.h.0.");
  std::vector<std::pair<std::string, Shape>> got;
  for (const auto& e : params.entries()) got.emplace_back(e.name, e.shape);
  const std::vector<std::pair<std::string, Shape>> want = {
      {"transformer.h.0.ln_1.weight", Shape{D}},           {"transformer.h.0.ln_1.bias", Shape{D}},
      {"transformer.h.0.attn.c_attn.weight", Shape{3 * D, D}}, {"transformer.h.0.attn.c_attn.bias", Shape{3 * D}},
      {"transformer.h.0.attn.c_proj.weight", Shape{D, D}},     {"transformer.h.0.attn.c_proj.bias", Shape{D}},
      {"transformer.h.0.ln_2.weight", Shape{D}},           {"transformer.h.0.ln_2.bias", Shape{D}},
      {"transformer.h.0.mlp.c_fc.weight", Shape{4 * D, D}},    {"transformer.h.0.mlp.c_fc.bias", Shape{4 * D}},
      {"transformer.h.0.mlp.c_proj.weight", Shape{D, 4 * D}},  {"transformer.h.0.mlp.c_proj.bias", Shape{D}},
  };
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace cohort::nn::testing
