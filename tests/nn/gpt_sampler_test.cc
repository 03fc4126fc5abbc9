// nn::GptSampler: the KV cache's logits against Gpt::forward's at every position (token by token,
// a prompt then token by token, one head, the full context), deterministic sampling, top-k and tiny
// temperatures against greedy decoding, the context limit, and what it refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/gpt_sampler.h"
#include "runtime/error.h"
#include "tests/nn/grad_check.h"

namespace cohort::nn::testing {
namespace {

using runtime::Shape;
using runtime::Tensor;

// A Gpt bound on the CPU with its parameters from GPT-2's initialisation (seed), or, with
// `orderOne`, redrawn uniform in ±1 so that the logits differ clearly between tokens (GPT-2's
// initial ones are almost uniform, which makes greedy decoding a matter of rounding).
struct Bound {
  Bound(const GptOptions& options, uint64_t seed, bool orderOne = false) : model(options) {
    bindParams(model, params, seed);
    if (!orderOne) return;
    runtime::Rng rng(seed + 1);
    for (int64_t i = 0; i < params.values().numel(); ++i) params.values().at(i) = rng.uniform(-1.0f, 1.0f);
  }
  Gpt model;
  ParamBuffer params;
};

const GptOptions kSmall{.vocab = 11, .layers = 2, .heads = 2, .dim = 16, .context = 9};

std::vector<int64_t> randomTokens(int64_t count, int64_t vocab, uint64_t seed) {
  runtime::Rng rng(seed);
  std::vector<int64_t> ids(static_cast<size_t>(count));
  for (auto& id : ids) id = static_cast<int64_t>(rng.below(static_cast<uint64_t>(vocab)));
  return ids;
}

// Gpt::forward's logits for one sequence, [T, V] as a flat vector.
std::vector<float> fullForward(Gpt& model, const std::vector<int64_t>& ids) {
  const auto T = static_cast<int64_t>(ids.size());
  Tensor input = Tensor::zeros(Shape{1, T});
  for (int64_t t = 0; t < T; ++t) input.at(t) = static_cast<float>(ids[static_cast<size_t>(t)]);
  const Tensor& logits = model.forward(input, Pass{.training = false, .needInputGrad = false});
  return std::vector<float>(logits.data(), logits.data() + logits.numel());
}

// The sampler's logits after position t against row t of the full forward, to 1e-5 of the row's
// largest magnitude.
void expectRowMatches(std::span<const float> got, const std::vector<float>& full, int64_t t, int64_t vocab) {
  ASSERT_EQ(static_cast<int64_t>(got.size()), vocab);
  const float* want = full.data() + t * vocab;
  float largest = 0.0f;
  for (int64_t v = 0; v < vocab; ++v) largest = std::max(largest, std::fabs(want[v]));
  for (int64_t v = 0; v < vocab; ++v) {
    EXPECT_NEAR(got[static_cast<size_t>(v)], want[v], 1e-5f * largest) << "position " << t << ", token " << v;
  }
}

int64_t argmax(std::span<const float> logits) {
  return std::max_element(logits.begin(), logits.end()) - logits.begin();
}

// Greedy decoding through feed(): the first largest logit each time, fed back.
std::vector<int64_t> greedy(GptSampler& sampler, const std::vector<int64_t>& prompt, int64_t count) {
  sampler.reset();
  std::span<const float> logits = sampler.feed(prompt);
  std::vector<int64_t> out;
  while (static_cast<int64_t>(out.size()) < count && sampler.length() < sampler.options().context) {
    out.push_back(argmax(logits));
    logits = sampler.feed(std::span<const int64_t>(&out.back(), 1));
  }
  return out;
}

TEST(GptSampler, TokenByTokenMatchesTheFullForwardAtEveryPosition) {
  struct Case {
    int64_t heads, time;
    bool orderOne;
  };
  for (const Case c : {Case{2, 7, false}, Case{2, 7, true}, Case{1, 6, true}, Case{2, 9, true}, Case{1, 9, false}}) {
    SCOPED_TRACE("heads " + std::to_string(c.heads) + ", time " + std::to_string(c.time) +
                 (c.orderOne ? ", parameters of order 1" : ", GPT-2's initialisation"));
    GptOptions options = kSmall;
    options.heads = c.heads;
    Bound m(options, 31, c.orderOne);
    const std::vector<int64_t> ids = randomTokens(c.time, options.vocab, 32);
    const std::vector<float> full = fullForward(m.model, ids);
    GptSampler sampler(m.model, m.params);
    for (int64_t t = 0; t < c.time; ++t) {
      expectRowMatches(sampler.feed(std::span<const int64_t>(&ids[static_cast<size_t>(t)], 1)), full, t, options.vocab);
      EXPECT_EQ(sampler.length(), t + 1);
    }
  }
}

TEST(GptSampler, APromptThenTokenByTokenMatchesTheFullForward) {
  for (const int64_t heads : {1, 2}) {
    GptOptions options = kSmall;
    options.heads = heads;
    Bound m(options, 41, /*orderOne=*/true);
    const std::vector<int64_t> ids = randomTokens(options.context, options.vocab, 42);
    const std::vector<float> full = fullForward(m.model, ids);
    GptSampler sampler(m.model, m.params);
    for (int round = 0; round < 2; ++round) {  // the second after reset(): nothing of the first remains
      SCOPED_TRACE("heads " + std::to_string(heads) + ", round " + std::to_string(round));
      sampler.reset();
      EXPECT_EQ(sampler.length(), 0);
      expectRowMatches(sampler.feed(std::span<const int64_t>(ids).first(3)), full, 2, options.vocab);
      for (int64_t t = 3; t < options.context; ++t) {
        expectRowMatches(sampler.feed(std::span<const int64_t>(&ids[static_cast<size_t>(t)], 1)), full, t,
                         options.vocab);
      }
      EXPECT_EQ(sampler.length(), options.context);
    }
  }
}

TEST(GptSampler, SamplingIsDeterministicForASeed) {
  Bound m({.vocab = 11, .layers = 2, .heads = 2, .dim = 16, .context = 40}, 51);
  GptSampler sampler(m.model, m.params);
  const std::vector<int64_t> prompt{3, 1, 4};
  const std::vector<int64_t> a = sampler.generate(prompt, 30, {.seed = 7});
  const std::vector<int64_t> b = sampler.generate(prompt, 30, {.seed = 7});
  const std::vector<int64_t> c = sampler.generate(prompt, 30, {.seed = 8});
  EXPECT_EQ(a.size(), 30u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);  // 30 draws from nearly uniform logits over 11 tokens
  EXPECT_EQ(sampler.length(), 33);
  for (const int64_t id : a) EXPECT_TRUE(id >= 0 && id < 11) << id;
}

TEST(GptSampler, TopOneAndATinyTemperatureAreGreedy) {
  Bound m({.vocab = 11, .layers = 2, .heads = 2, .dim = 16, .context = 24}, 61, /*orderOne=*/true);
  GptSampler sampler(m.model, m.params);
  const std::vector<int64_t> prompt{5, 2};
  const std::vector<int64_t> want = greedy(sampler, prompt, 20);
  ASSERT_EQ(want.size(), 20u);
  for (const uint64_t seed : {1u, 2u, 3u}) {
    EXPECT_EQ(sampler.generate(prompt, 20, {.topK = 1, .seed = seed}), want) << "seed " << seed;
    EXPECT_EQ(sampler.generate(prompt, 20, {.temperature = 1e-6f, .seed = seed}), want) << "seed " << seed;
    EXPECT_EQ(sampler.generate(prompt, 20, {.temperature = 1e-6f, .topK = 3, .seed = seed}), want) << "seed " << seed;
  }
}

TEST(GptSampler, TopKSamplesOnlyAmongTheKLargestLogits) {
  Bound m({.vocab = 11, .layers = 2, .heads = 2, .dim = 16, .context = 30}, 71, /*orderOne=*/true);
  GptSampler sampler(m.model, m.params);
  const std::vector<int64_t> prompt{0};
  const std::vector<int64_t> sampled = sampler.generate(prompt, 29, {.temperature = 2.0f, .topK = 2, .seed = 72});
  ASSERT_EQ(sampled.size(), 29u);
  // Replay: at every step the token drawn is one of the two largest logits.
  sampler.reset();
  std::span<const float> now = sampler.feed(prompt);
  std::vector<float> sorted;
  for (const int64_t token : sampled) {
    sorted.assign(now.begin(), now.end());
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    EXPECT_GE(now[static_cast<size_t>(token)], sorted[1]) << "token " << token;
    now = sampler.feed(std::span<const int64_t>(&token, 1));
  }
}

// Past the context the window slides: the cache restarts from the text's last context/2 tokens.
// The tokens sampled then are those of a fresh sampler fed that window (the same logits), and any
// count is generated.
TEST(GptSampler, SlidesItsWindowPastTheContext) {
  Bound m(kSmall, 81);
  GptSampler sampler(m.model, m.params);
  const std::vector<int64_t> prompt{1, 2, 3};
  const std::vector<int64_t> long100 = sampler.generate(prompt, 100, {.topK = 1});
  EXPECT_EQ(long100.size(), 100u);
  EXPECT_LE(sampler.length(), 9);
  EXPECT_GE(sampler.length(), 4);
  EXPECT_EQ(sampler.generate(prompt, 6, {.seed = 1}).size(), 6u);
  EXPECT_EQ(sampler.length(), 9);  // 3 + 6: the context, full but not slid
  EXPECT_EQ(sampler.generate(prompt, 2, {.seed = 1}).size(), 2u);
  EXPECT_EQ(sampler.length(), 5);
  EXPECT_TRUE(sampler.generate(prompt, 0, {.seed = 1}).empty());
  // Greedy decoding from the window: the 10th token of the text finds the cache full (9 tokens),
  // which restarts from the text's last 4 (context/2), tokens 7 to 10; the next 5 are a fresh
  // sampler's greedy choices after those 4.
  std::vector<int64_t> text = prompt;
  text.insert(text.end(), long100.begin(), long100.end());
  const std::vector<int64_t> window(text.begin() + 6, text.begin() + 10);
  GptSampler fresh(m.model, m.params);
  const std::vector<int64_t> next = fresh.generate(window, 5, {.topK = 1});
  for (size_t i = 0; i < next.size(); ++i) EXPECT_EQ(next[i], text[10 + i]) << i;
  // A prompt filling the context slides at once.
  const std::vector<int64_t> full = randomTokens(9, 11, 82);
  EXPECT_EQ(sampler.generate(full, 5, {.seed = 1}).size(), 5u);
}

TEST(GptSampler, RefusesWhatItCannotRun) {
  Bound m(kSmall, 91);
  GptSampler sampler(m.model, m.params);
  const std::vector<int64_t> none;
  EXPECT_THROW(sampler.feed(none), InvalidArgument);
  EXPECT_THROW(sampler.feed(std::vector<int64_t>{1, 11}), InvalidArgument);
  EXPECT_THROW(sampler.feed(std::vector<int64_t>{-1}), InvalidArgument);
  EXPECT_EQ(sampler.length(), 0);  // a refused feed leaves the cache as it was
  sampler.feed(randomTokens(8, 11, 92));
  EXPECT_THROW(sampler.feed(std::vector<int64_t>{1, 2}), InvalidArgument);  // 10 > context 9
  EXPECT_EQ(sampler.length(), 8);
  sampler.feed(std::vector<int64_t>{1});
  EXPECT_THROW(sampler.feed(std::vector<int64_t>{1}), InvalidArgument);

  const std::vector<int64_t> prompt{1};
  EXPECT_THROW(sampler.generate(prompt, 3, {.temperature = 0.0f}), InvalidArgument);
  EXPECT_THROW(sampler.generate(prompt, 3, {.temperature = -1.0f}), InvalidArgument);
  EXPECT_THROW(sampler.generate(prompt, 3, {.temperature = NAN}), InvalidArgument);
  EXPECT_THROW(sampler.generate(prompt, 3, {.topK = -1}), InvalidArgument);
  EXPECT_THROW(sampler.generate(prompt, -1, {}), InvalidArgument);
  EXPECT_THROW(sampler.generate(none, 3, {}), InvalidArgument);
  EXPECT_THROW(sampler.generate(randomTokens(10, 11, 93), 1, {}), InvalidArgument);  // longer than the context
  EXPECT_THROW(sampler.generate(std::vector<int64_t>{11}, 1, {}), InvalidArgument);

  Gpt unbound(kSmall);
  ParamBuffer unboundParams;
  unbound.registerParams(unboundParams, "");
  EXPECT_THROW(GptSampler(unbound, unboundParams), InvalidArgument);
  Bound other({.vocab = 12, .layers = 2, .heads = 2, .dim = 16, .context = 9}, 94);
  EXPECT_THROW(GptSampler(m.model, other.params), InvalidArgument);  // another model's buffer
}

// A 4-layer, 128-wide model over its whole context of 256: the cache's last logits against the full
// forward's, and the rate, which is printed (a KV cache makes each token cost O(context), not a
// forward over the prefix).
TEST(GptSampler, FillsTheContextOfAWiderModel) {
  const GptOptions options{.vocab = 256, .layers = 4, .heads = 4, .dim = 128, .context = 256};
  Bound m(options, 101);
  GptSampler sampler(m.model, m.params);
  const std::vector<int64_t> prompt{10, 20, 30, 40};
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int64_t> sampled = sampler.generate(prompt, 252, {.temperature = 0.9f, .topK = 40, .seed = 102});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(sampled.size(), 252u);
  EXPECT_EQ(sampler.length(), 256);
  std::cout << "[ rate     ] " << static_cast<double>(sampled.size()) / seconds << " tokens/s" << std::endl;

  std::vector<int64_t> all = prompt;
  all.insert(all.end(), sampled.begin(), sampled.end());
  const std::vector<float> full = fullForward(m.model, all);
  sampler.reset();
  sampler.feed(std::span<const int64_t>(all).first(255));
  expectRowMatches(sampler.feed(std::span<const int64_t>(all).last(1)), full, 255, options.vocab);
}

}  // namespace
}  // namespace cohort::nn::testing
