// GptSampler: text generation from a trained nn::Gpt on the CPU with a KV cache, so that each new
// token costs one row through the network instead of a forward over the whole prefix.
//
// The sampler keeps, for every layer, the keys and the values of every position fed so far
// (k and v caches of [heads, context, headDim] per layer, allocated once for the model's context).
// feed() runs only the new tokens: embedding (wte[id] + wpe[position]), then per block ln_1, the
// c_attn projection of the new rows, their k and v appended to the cache, each new query attending
// to the cached positions 0..t (scores q·k/√headDim, softmax, weighted sum of the cached values),
// c_proj and the residual, ln_2, c_fc, GELU (tanh form), mlp c_proj and the residual; then ln_f and
// the tied head, logits = x · wteᵀ, for the last new token only. The result is Gpt::forward's
// logits row at that position, up to float rounding.
//
// Parameters are read by nanoGPT's names ("transformer.h.0.attn.c_attn.weight", ...) from the
// ParamBuffer the Gpt was registered in with prefix "" (as nn::Model and the tests do), at every
// feed(), so values the optimiser changes or a relocation (on the CPU) are picked up; after a
// change the cache describes the old weights: call reset(). The sampler reads the parameters and
// never writes them; it does not use the Gpt's own forward buffers, so the model may also be
// trained or evaluated between calls.
// Ownership: the ParamBuffer is borrowed and must outlive the sampler (the Gpt is read only for its
// sizes, at construction). The cache and the scratch rows are the sampler's own (2·layers·context·dim
// floats for the cache; the scratch grows to the longest single feed()).
// Thread safety: one thread at a time per sampler. Samplers on several threads may share one model
// while nothing writes its parameters and the CPU GEMM runs on one thread (runtime/cpu/blas.h).
//
//   GptSampler sampler(gpt, params);   // gpt bound (params allocated) on the CPU
//   std::vector<int64_t> text = sampler.generate(prompt, 200, {.temperature = 0.8f, .topK = 40, .seed = 7});
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "nn/gpt.h"
#include "nn/param_buffer.h"
#include "runtime/random.h"

namespace cohort::nn {

struct SampleOptions {
  float temperature = 1.0f;  // > 0; logits are divided by it before the softmax
  int64_t topK = 0;          // sample among the topK largest logits; 0 (or >= vocab): all of them
  uint64_t seed = 0;         // runtime::Rng's seed: the same seed gives the same tokens
  // Called with each new token as soon as it is drawn (e.g. to print it); returning false stops the
  // generation there, and generate() returns the tokens drawn so far.
  std::function<bool(int64_t token)> onToken = {};
};

class GptSampler {
 public:
  // `params` is the buffer `model` registered its parameters in (prefix ""), bound on the CPU.
  // InvalidArgument when it is not bound, lives on a GPU, or lacks one of the model's parameters
  // under its nanoGPT name and shape.
  GptSampler(const Gpt& model, const ParamBuffer& params);
  GptSampler(const GptSampler&) = delete;
  GptSampler& operator=(const GptSampler&) = delete;

  // Empties the cache: the next feed() starts at position 0.
  void reset() { length_ = 0; }

  // Feeds `tokens` (ids in [0, vocab)) after those already fed and returns the logits [vocab]
  // predicting the token after the last one. The view stays valid until the next feed(),
  // generate() or the sampler's end. InvalidArgument, with the cache unchanged, when tokens is
  // empty, an id is out of range, the cache would pass the context length, or the parameters have
  // moved to a GPU.
  std::span<const float> feed(std::span<const int64_t> tokens);

  // Tokens in the cache (0..context).
  int64_t length() const { return length_; }

  // Starts from an empty cache, feeds `prompt`, then samples `count` tokens, feeding each back, and
  // returns the sampled tokens only (the cache then holds the prompt and them). Each token is drawn
  // from softmax(logits / temperature) restricted to the topK largest logits (ties to the lower
  // id), with runtime::Rng seeded by options.seed: deterministic for a seed; topK = 1 is greedy
  // (argmax) decoding. Past the context the window slides, as nanoGPT crops its input to the last
  // context tokens: when the cache is full, it restarts from the last context/2 tokens of the text
  // (fed again in one batch: one recomputation of half a window per context/2 new tokens), so any
  // count is generated. The cache then holds the prompt and the sampled tokens, or once the window
  // has slid, the text's last tokens.
  // InvalidArgument for temperature <= 0 (or not finite), topK < 0, count < 0, and as feed() for
  // the prompt (empty, a bad id, or longer than the context).
  std::vector<int64_t> generate(std::span<const int64_t> prompt, int64_t count, const SampleOptions& options);

  const GptOptions& options() const { return options_; }

 private:
  // Where one block's parameters start in the ParamBuffer's values (offsets in floats).
  struct BlockOffsets {
    size_t ln1Weight, ln1Bias, attnWeight, attnBias, attnProjWeight, attnProjBias;
    size_t ln2Weight, ln2Bias, fcWeight, fcBias, mlpProjWeight, mlpProjBias;
  };

  size_t offsetOf(const std::string& name, const Shape& shape) const;
  // A bias's offset, or kNoBias for a model without biases (GptOptions::bias false), whose bias()
  // reads zeros_.
  static constexpr size_t kNoBias = SIZE_MAX;
  size_t biasOffsetOf(const std::string& name, const Shape& shape) const;
  const float* bias(const float* values, size_t offset) const;
  // Runs rows_ = tokens.size() new positions through block `layer`, in place on x_.
  void runBlock(int64_t layer, const float* values);
  // attention_[r] for each new row r: its query against the cached positions 0..length_ + r.
  void attend(int64_t layer);
  // Appends the new rows' keys and values (from qkv_) to layer `layer`'s cache.
  void appendToCache(int64_t layer);
  float* cacheKeys(int64_t layer, int64_t head) { return kCache_.data() + cacheOffset(layer, head); }
  float* cacheValues(int64_t layer, int64_t head) { return vCache_.data() + cacheOffset(layer, head); }
  size_t cacheOffset(int64_t layer, int64_t head) const;
  void ensureRows(int64_t rows);
  int64_t sample(const SampleOptions& options, runtime::Rng& rng);

  const ParamBuffer& params_;
  GptOptions options_;
  int64_t headDim_;
  size_t wte_, wpe_, lnFWeight_, lnFBias_;
  std::vector<BlockOffsets> blocks_;

  int64_t length_ = 0;                  // positions in the cache
  int64_t rows_ = 0;                    // positions in the feed() being run
  std::vector<float> kCache_, vCache_;  // [layers, heads, context, headDim] each
  // Scratch for the rows of one feed(): the residual stream x [rows, D], a LayerNorm output [rows, D],
  // q,k,v [rows, 3D], attention output [rows, D], MLP hidden [rows, 4D]; probabilities [context];
  // logits [V].
  std::vector<float> x_, normed_, qkv_, attention_, hidden_, probs_, logits_;
  std::vector<std::pair<double, int64_t>> candidates_;  // sample()'s scratch: (logit, id)
  std::vector<float> zeros_;  // [4D] without biases: every bias read
};

}  // namespace cohort::nn
