#include "nn/gpt_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "nn/gelu.h"
#include "nn/layer_norm.h"
#include "nn/softmax.h"
#include "runtime/cpu/blas.h"
#include "runtime/error.h"

namespace cohort::nn {

namespace {

// nn::LayerNorm's default, the one Gpt's ln_1, ln_2 and ln_f use.
constexpr double kLayerNormEps = 1e-5;

// One Linear's parameters in Linear's layout: weight [out, in], bias [out].
struct Projection {
  const float* weight;
  const float* bias;
  int64_t in;
  int64_t out;
};

// y += x·Wᵀ + b for x [rows, in] and y [rows, out] (the bias added first, the product by one GEMM).
void addProjection(const Projection& p, const float* x, int64_t rows, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < p.out; ++j) y[r * p.out + j] += p.bias[j];
  }
  runtime::cpu::gemm({.m = static_cast<int>(rows),
                      .n = static_cast<int>(p.out),
                      .k = static_cast<int>(p.in),
                      .transB = true,
                      .beta = 1.0f},
                     x, p.weight, y);
}

// y = x·Wᵀ + b.
void project(const Projection& p, const float* x, int64_t rows, float* y) {
  std::fill(y, y + rows * p.out, 0.0f);
  addProjection(p, x, rows, y);
}

}  // namespace

GptSampler::GptSampler(const Gpt& model, const ParamBuffer& params)
    : params_(params), options_(model.options()), headDim_(options_.dim / options_.heads) {
  if (!params.bound() || params.values().device().isCuda()) {
    COHORT_THROW(InvalidArgument) << "GptSampler needs " << model.name() << "'s parameters bound on the CPU"
                                  << (params.bound() ? ", they are on a GPU" : ", they are not bound");
  }
  const int64_t V = options_.vocab, D = options_.dim, C = options_.context;
  wte_ = offsetOf("transformer.wte.weight", Shape{V, D});
  wpe_ = offsetOf("transformer.wpe.weight", Shape{C, D});
  for (int64_t i = 0; i < options_.layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    blocks_.push_back({
        .ln1Weight = offsetOf(h + "ln_1.weight", Shape{D}),
        .ln1Bias = biasOffsetOf(h + "ln_1.bias", Shape{D}),
        .attnWeight = offsetOf(h + "attn.c_attn.weight", Shape{3 * D, D}),
        .attnBias = biasOffsetOf(h + "attn.c_attn.bias", Shape{3 * D}),
        .attnProjWeight = offsetOf(h + "attn.c_proj.weight", Shape{D, D}),
        .attnProjBias = biasOffsetOf(h + "attn.c_proj.bias", Shape{D}),
        .ln2Weight = offsetOf(h + "ln_2.weight", Shape{D}),
        .ln2Bias = biasOffsetOf(h + "ln_2.bias", Shape{D}),
        .fcWeight = offsetOf(h + "mlp.c_fc.weight", Shape{4 * D, D}),
        .fcBias = biasOffsetOf(h + "mlp.c_fc.bias", Shape{4 * D}),
        .mlpProjWeight = offsetOf(h + "mlp.c_proj.weight", Shape{D, 4 * D}),
        .mlpProjBias = biasOffsetOf(h + "mlp.c_proj.bias", Shape{D}),
    });
  }
  lnFWeight_ = offsetOf("transformer.ln_f.weight", Shape{D});
  lnFBias_ = biasOffsetOf("transformer.ln_f.bias", Shape{D});
  const auto cacheSize = static_cast<size_t>(options_.layers * C * D);  // heads · headDim = D
  kCache_.assign(cacheSize, 0.0f);
  vCache_.assign(cacheSize, 0.0f);
  probs_.assign(static_cast<size_t>(C), 0.0f);
  logits_.assign(static_cast<size_t>(V), 0.0f);
  if (!options_.bias) zeros_.assign(static_cast<size_t>(4 * D), 0.0f);
  ensureRows(1);
}

size_t GptSampler::biasOffsetOf(const std::string& name, const Shape& shape) const {
  return options_.bias ? offsetOf(name, shape) : kNoBias;
}

const float* GptSampler::bias(const float* values, size_t offset) const {
  return offset == kNoBias ? zeros_.data() : values + offset;
}

size_t GptSampler::offsetOf(const std::string& name, const Shape& shape) const {
  const ParamBuffer::Entry* entry = params_.find(name);
  if (!entry || entry->shape != shape) {
    COHORT_THROW(InvalidArgument) << "GptSampler: the parameter buffer has no " << name << " " << shape.str()
                                  << (entry ? ", it is " + entry->shape.str() : std::string())
                                  << " (is it this model's, registered with prefix \"\"?)";
  }
  return entry->offset;
}

void GptSampler::ensureRows(int64_t rows) {
  const auto d = static_cast<size_t>(rows * options_.dim);
  if (x_.size() >= d) return;
  x_.resize(d);
  normed_.resize(d);
  qkv_.resize(3 * d);
  attention_.resize(d);
  hidden_.resize(4 * d);
}

size_t GptSampler::cacheOffset(int64_t layer, int64_t head) const {
  return static_cast<size_t>(((layer * options_.heads + head) * options_.context) * headDim_);
}

std::span<const float> GptSampler::feed(std::span<const int64_t> tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size()), V = options_.vocab, D = options_.dim;
  if (params_.values().device().isCuda()) {
    COHORT_THROW(InvalidArgument) << "GptSampler: the model's parameters have moved to a GPU";
  }
  if (n == 0) COHORT_THROW(InvalidArgument) << "GptSampler::feed needs at least one token";
  if (length_ + n > options_.context) {
    COHORT_THROW(InvalidArgument) << "GptSampler: " << n << " more tokens after " << length_
                                  << " would pass the context length " << options_.context;
  }
  for (int64_t r = 0; r < n; ++r) {
    if (tokens[r] < 0 || tokens[r] >= V) {
      COHORT_THROW(InvalidArgument) << "GptSampler: token " << r << " is " << tokens[r]
                                    << ", outside the vocabulary 0.." << V - 1;
    }
  }
  ensureRows(n);
  rows_ = n;
  const float* values = params_.values().data();
  const float* wte = values + wte_;
  const float* wpe = values + wpe_;
  for (int64_t r = 0; r < n; ++r) {  // x = wte[id] + wpe[position]
    for (int64_t c = 0; c < D; ++c) x_[r * D + c] = wte[tokens[r] * D + c] + wpe[(length_ + r) * D + c];
  }
  for (int64_t layer = 0; layer < options_.layers; ++layer) runBlock(layer, values);
  length_ += n;
  // Only the last row's logits are asked for: ln_f and the tied head on it alone.
  const float* last = x_.data() + (n - 1) * D;
  layerNormRows(last, 1, D, values + lnFWeight_, bias(values, lnFBias_), kLayerNormEps, normed_.data());
  runtime::cpu::gemm({.m = 1, .n = static_cast<int>(V), .k = static_cast<int>(D), .transB = true}, normed_.data(), wte,
                     logits_.data());  // logits = x · wteᵀ
  // A padded vocabulary's extra ids are never drawn (Gpt's −inf logits).
  std::fill(logits_.begin() + options_.predictedVocab(), logits_.end(), -std::numeric_limits<float>::infinity());
  return logits_;
}

void GptSampler::runBlock(int64_t layer, const float* values) {
  const BlockOffsets& at = blocks_[static_cast<size_t>(layer)];
  const int64_t n = rows_, D = options_.dim;
  // h = x + c_proj(attention(c_attn(ln_1(x))))
  layerNormRows(x_.data(), n, D, values + at.ln1Weight, bias(values, at.ln1Bias), kLayerNormEps, normed_.data());
  project({values + at.attnWeight, bias(values, at.attnBias), D, 3 * D}, normed_.data(), n, qkv_.data());
  appendToCache(layer);
  attend(layer);
  addProjection({values + at.attnProjWeight, bias(values, at.attnProjBias), D, D}, attention_.data(), n, x_.data());
  // out = h + c_proj(gelu(c_fc(ln_2(h))))
  layerNormRows(x_.data(), n, D, values + at.ln2Weight, bias(values, at.ln2Bias), kLayerNormEps, normed_.data());
  project({values + at.fcWeight, bias(values, at.fcBias), D, 4 * D}, normed_.data(), n, hidden_.data());
  geluForward(hidden_.data(), hidden_.data(), n * 4 * D);
  addProjection({values + at.mlpProjWeight, bias(values, at.mlpProjBias), 4 * D, D}, hidden_.data(), n, x_.data());
}

// qkv_ row r is [q | k | v], each D = heads · headDim wide with the heads side by side (c_attn's
// output order); position length_ + r gets row r's k and v in every head's cache.
void GptSampler::appendToCache(int64_t layer) {
  const int64_t D = options_.dim, hd = headDim_;
  for (int64_t r = 0; r < rows_; ++r) {
    const float* k = qkv_.data() + r * 3 * D + D;
    const float* v = k + D;
    const int64_t position = length_ + r;
    for (int64_t h = 0; h < options_.heads; ++h) {
      std::copy(k + h * hd, k + (h + 1) * hd, cacheKeys(layer, h) + position * hd);
      std::copy(v + h * hd, v + (h + 1) * hd, cacheValues(layer, h) + position * hd);
    }
  }
}

// For new row r at position t = length_ + r and each head: scores_j = q·k_j / √headDim over the
// cached positions j = 0..t (the causal mask is the cache's end), softmax, and attention_ =
// Σ_j p_j · v_j, the heads side by side again.
void GptSampler::attend(int64_t layer) {
  const int64_t D = options_.dim, hd = headDim_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* p = probs_.data();
  for (int64_t r = 0; r < rows_; ++r) {
    const int64_t visible = length_ + r + 1;
    for (int64_t h = 0; h < options_.heads; ++h) {
      const float* q = qkv_.data() + r * 3 * D + h * hd;
      const float* keys = cacheKeys(layer, h);
      const float* vals = cacheValues(layer, h);
      for (int64_t j = 0; j < visible; ++j) {
        float dot = 0.0f;
        for (int64_t e = 0; e < hd; ++e) dot += q[e] * keys[j * hd + e];
        p[j] = scale * dot;
      }
      softmaxRows(p, p, 1, visible, /*log=*/false);
      float* y = attention_.data() + r * D + h * hd;
      std::fill(y, y + hd, 0.0f);
      for (int64_t j = 0; j < visible; ++j) {
        for (int64_t e = 0; e < hd; ++e) y[e] += p[j] * vals[j * hd + e];
      }
    }
  }
}

std::vector<int64_t> GptSampler::generate(std::span<const int64_t> prompt, int64_t count,
                                          const SampleOptions& options) {
  if (!(options.temperature > 0.0f) || !std::isfinite(options.temperature) || options.topK < 0 || count < 0) {
    COHORT_THROW(InvalidArgument)
        << "GptSampler::generate needs a finite temperature > 0, topK >= 0 and count >= 0, got " << options.temperature
        << ", " << options.topK << ", " << count;
  }
  reset();
  feed(prompt);
  runtime::Rng rng(options.seed);
  std::vector<int64_t> text(prompt.begin(), prompt.end());
  const auto promptTokens = static_cast<int64_t>(text.size());
  while (static_cast<int64_t>(text.size()) - promptTokens < count) {
    const int64_t token = sample(options, rng);
    text.push_back(token);
    if (options.onToken && !options.onToken(token)) break;
    if (length_ == options_.context) {
      // The window slides: the cache restarts from the text's last context/2 tokens, this one included.
      const int64_t keep = std::max<int64_t>(1, options_.context / 2);
      reset();
      feed(std::span<const int64_t>(text.data() + text.size() - keep, static_cast<size_t>(keep)));
    } else {
      feed(std::span<const int64_t>(&text.back(), 1));
    }
  }
  return {text.begin() + promptTokens, text.end()};
}

// One token from softmax(logits_ / temperature) over the topK largest logits (ties to the lower
// id), by inverse transform of one 53-bit uniform from `rng`. The candidates are walked in a fixed
// order (by id for all of them, else by falling logit then id), so the choice depends only on the
// logits and the seed. A tiny temperature gives the largest logit weight 1 and the others 0.
int64_t GptSampler::sample(const SampleOptions& options, runtime::Rng& rng) {
  const int64_t V = options_.predictedVocab();  // a padded vocabulary's extra ids are no candidates
  candidates_.clear();
  for (int64_t id = 0; id < V; ++id) candidates_.emplace_back(logits_[static_cast<size_t>(id)], id);
  if (options.topK > 0 && options.topK < V) {
    const auto first = [](const std::pair<double, int64_t>& a, const std::pair<double, int64_t>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::partial_sort(candidates_.begin(), candidates_.begin() + options.topK, candidates_.end(), first);
    candidates_.resize(static_cast<size_t>(options.topK));
  }
  double largest = candidates_.front().first;
  for (const auto& c : candidates_) largest = std::max(largest, c.first);
  double total = 0.0;
  for (auto& c : candidates_) {  // the logit becomes its unnormalised probability
    c.first = std::exp((c.first - largest) / options.temperature);
    total += c.first;
  }
  const double target = static_cast<double>(rng.nextU64() >> 11) * 0x1.0p-53 * total;
  double cumulative = 0.0;
  int64_t chosen = candidates_.front().second;
  for (const auto& c : candidates_) {
    if (c.first <= 0.0) continue;
    chosen = c.second;  // the last positive one, should rounding leave target past the sum
    cumulative += c.first;
    if (target < cumulative) break;
  }
  return chosen;
}

}  // namespace cohort::nn
