#include "nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "nn/gpu_dispatch.h"
#include "nn/precision.h"
#include "runtime/cpu/blas.h"
#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/precision_kernels.h"
#endif

namespace cohort::nn {

namespace {

const GptOptions& checked(const GptOptions& o) {
  if (o.vocab < 1 || o.layers < 1 || o.heads < 1 || o.dim < 1 || o.context < 1 || o.dim % o.heads != 0) {
    COHORT_THROW(InvalidArgument) << "a GPT needs positive sizes and a width divisible by the heads, got vocabulary "
                                  << o.vocab << ", " << o.layers << " layers, " << o.heads << " heads, width "
                                  << o.dim << ", context " << o.context;
  }
  if (o.realVocab < 0 || o.realVocab > o.vocab) {
    COHORT_THROW(InvalidArgument) << "a GPT's real vocabulary " << o.realVocab << " must be in 1.." << o.vocab
                                  << ", the padded vocabulary";
  }
  return o;
}

}  // namespace

Gpt::Gpt(const GptOptions& o)
    : options_(checked(o)),
      wte_({.vocab = o.vocab, .dim = o.dim}),
      wpe_({.vocab = o.context, .dim = o.dim}),
      lnF_(LayerNormOptions{.features = o.dim, .bias = o.bias}),
      drop_(o.dropout) {
  for (int64_t i = 0; i < o.layers; ++i) {
    blocks_.push_back(std::make_unique<TransformerBlock>(
        TransformerBlockOptions{.attention = {.dim = o.dim, .heads = o.heads, .bias = o.bias}, .dropout = o.dropout}));
  }
  blockUnits_.resize(blocks_.size());
  setRecompute(o.recompute);
}

void Gpt::setRecompute(RecomputeMode mode) {
  if (forwardRan_) COHORT_THROW(InvalidArgument) << name() << ": the recompute mode is set before the first forward";
  if (mode != RecomputeMode::kNone && options_.dropout > 0.0f) {
    // A recomputed forward would draw other dropout masks than the forward whose output was used.
    COHORT_THROW(InvalidArgument) << name() << " with dropout " << options_.dropout
                                  << " cannot recompute activations: use dropout=0 or no recompute";
  }
  options_.recompute = mode;
  recomputed_.clear();
  for (auto& block : blocks_) {
    block->setRecompute(mode == RecomputeMode::kSelective ? mode : RecomputeMode::kNone);
    if (mode == RecomputeMode::kFull) recomputed_.push_back(std::make_unique<Recompute>(*block));
  }
}

// Block i's buffers shared with block 0's as the recompute mode allows (block 0 has run this pass,
// so a buffer it grew is the one shared).
void Gpt::shareBlockBuffers(size_t i, runtime::Device device) {
  if (i == 0) return;
  if (options_.recompute == RecomputeMode::kFull) blocks_[i]->shareForwardBuffers(*blocks_[0]);
  if (options_.recompute == RecomputeMode::kSelective) blocks_[i]->shareSelectiveBuffers(*blocks_[0], device);
}

// The blocks and ln_f. Chained (every mode but kFull, whose nn::Recompute wrappers take and give
// tensors): each residual addition between blocks is made by the LayerNorm that reads it, the next
// block's ln_1 or ln_f (TransformerBlock::forwardChained; one kernel on a GPU).
const Tensor& Gpt::blocksForward(const Tensor& input, const Pass& pass) {
  if (options_.recompute == RecomputeMode::kFull) {
    const Tensor* h = &input;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      shareBlockBuffers(i, input.device());
      h = &forwardOfUnit(pass, blockUnits_[i], [&]() -> const Tensor& { return recomputed_[i]->forward(*h, pass); });
    }
    return forwardOfUnit(pass, lnFUnit_, [&]() -> const Tensor& { return lnF_.forward(*h, pass); });
  }
  std::optional<ResidualAdd> open;  // the last block's output, as the addition it left
  for (size_t i = 0; i < blocks_.size(); ++i) {
    shareBlockBuffers(i, input.device());
    const BlockInput in = open ? BlockInput{.add = &*open} : BlockInput{.x = &input};
    const ResidualAdd next = forwardOfUnit(pass, blockUnits_[i], [&] { return blocks_[i]->forwardChained(in, pass); });
    open.emplace(next);
  }
  return forwardOfUnit(pass, lnFUnit_, [&]() -> const Tensor& { return lnF_.forwardAdded(*open, pass); });
}

std::string Gpt::name() const {
  return "GPT(layers " + std::to_string(options_.layers) + ", heads " + std::to_string(options_.heads) + ", width " +
         std::to_string(options_.dim) + ", context " + std::to_string(options_.context) + ", vocabulary " +
         std::to_string(options_.vocab) + ")";
}

void Gpt::registerParams(ParamBuffer& params, const std::string& prefix) {
  params.beginUnit(prefix + "transformer.embeddings");
  params_ = &params;
  wte_.registerParams(params, prefix + "transformer.wte.");
  wteEntry_ = params.entries().size() - 1;  // the head reads it rounded, from the bf16 copy
  wpe_.registerParams(params, prefix + "transformer.wpe.");
  embeddingsUnit_ = params.endUnit();
  blockUnits_.assign(blocks_.size(), std::nullopt);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const std::string name = prefix + "transformer.h." + std::to_string(i);
    params.beginUnit(name);
    blocks_[i]->registerParams(params, name + ".");
    blockUnits_[i] = params.endUnit();
  }
  params.beginUnit(prefix + "transformer.ln_f");
  lnF_.registerParams(params, prefix + "transformer.ln_f.");
  lnFUnit_ = params.endUnit();
}

void Gpt::resetParams(runtime::Rng& rng) { resetByPlan(*this, rng); }

void Gpt::planInit(InitPlan& plan) const {
  wte_.planInit(plan);  // normal(0, 0.02)
  wpe_.planInit(plan);
  const float residual = 0.02f / std::sqrt(2.0f * static_cast<float>(options_.layers));
  for (const auto& block : blocks_) {
    // LayerNorms 1 and 0, and the Linears uniform: those draws stay consumed (the values are GPT-2's
    // since Cohort's first GPT), but the fills below replace them, so they are never computed.
    block->planInit(plan);
    for (const Linear* l : {&block->attn().cAttn(), &block->attn().cProj(), &block->mlpFc(), &block->mlpProjection()}) {
      const bool projection = l == &block->attn().cProj() || l == &block->mlpProjection();
      plan.normal(l->weightTarget(), projection ? residual : 0.02f, InitPlan::NormalScale::kFloat);
      if (options_.bias) plan.constant(l->biasTarget(), 0.0f);
    }
  }
  lnF_.planInit(plan);
}

Shape Gpt::outputShape(const Shape& input) const {
  if (input.rank() != 2 || input[1] < 1 || input[1] > options_.context) {
    COHORT_THROW(InvalidArgument) << name() << " needs token ids [batch, time] with time 1.." << options_.context
                                  << ", got " << input.str();
  }
  return Shape{input[0], input[1], options_.vocab};
}

const Tensor& Gpt::forward(const Tensor& input, const Pass& pass) {
  const Shape out = outputShape(input.shape());
  batch_ = input.dim(0);
  time_ = input.dim(1);
  const int64_t B = batch_, T = time_, D = options_.dim;
  forwardRan_ = true;
  if (!positions_.defined() || positions_.numel() != T || positions_.device() != input.device()) {
    Tensor ids = Tensor::zeros(Shape{T});
    for (int64_t t = 0; t < T; ++t) ids.at(t) = static_cast<float>(t);
    positions_ = ids;
#ifdef COHORT_HAVE_CUDA
    if (onGpu(input)) positions_ = ids.clone(gpuFor(pass, input, name()).allocator());
#endif
  }
  tellUnit(pass, embeddingsUnit_, &UnitListener::beforeForward);  // open until the head has used wte
  const Tensor& tokens = wte_.forward(input, pass);
  const Tensor& pos = wpe_.forward(positions_, pass);
#ifdef COHORT_HAVE_CUDA
  if (onGpu(input)) {
    auto& gpu = gpuFor(pass, input, name());
    runtime::ensureShape(x_, tokens.shape(), gpu.allocator());
    runtime::cuda::copyOnDevice(x_.data(), tokens.data(), tokens.bytes(), gpu.stream());
    for (int64_t b = 0; b < B; ++b) {
      runtime::cuda::axpy(1.0f, {pos.data(), static_cast<size_t>(T * D)}, {x_.data() + b * T * D, static_cast<size_t>(T * D)},
                          gpu.stream());
    }
  } else
#endif
  {
    runtime::ensureShape(x_, tokens.shape());
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < T * D; ++i) x_.data()[b * T * D + i] = tokens.data()[b * T * D + i] + pos.data()[i];
    }
  }
  const Tensor* h = options_.dropout > 0.0f ? &drop_.forward(x_, pass) : &x_;  // nanoGPT's transformer.drop
  const Tensor& f = blocksForward(*h, pass);
  final_ = &f;
#ifdef COHORT_HAVE_CUDA
  if (onGpu(input)) {  // bf16 logits in a bf16 pass
    runtime::ensureShape(logits_, out, gpuFor(pass, input, name()).allocator(), pass.precision);
  } else
#endif
  {
    runtime::ensureShape(logits_, out);
  }
  headForward(f, logits_, pass);
  tellUnit(pass, embeddingsUnit_, &UnitListener::afterForward);
  return logits_;
}

// logits = x · wteᵀ: fp32, or on a GPU in a bf16 pass from x and wte rounded to bf16 (the
// ParamBuffer's bf16 copy; fp32 sums, logits rounded once to bf16, as autocast and llm.c write them).
void Gpt::headForward(const Tensor& f, const Tensor& logits, const Pass& pass) {
  const int64_t D = options_.dim, V = options_.vocab, rows = batch_ * time_;
  const runtime::GemmOptions head{.m = static_cast<int>(rows), .n = static_cast<int>(V), .k = static_cast<int>(D), .transB = true};
#ifdef COHORT_HAVE_CUDA
  if (onGpu(f)) {
    auto& gpu = gpuFor(pass, f, name());
    if (pass.precision != runtime::DType::kBF16) {
      gpu.blas().gemm(head, f.data(), wte_.weight().data(), logits.data());
      return maskPadding(logits, pass);
    }
    const runtime::DType bf16 = runtime::DType::kBF16;
    final16_ = precision::toType(f, bf16, finalCast_, pass, *this);  // ln_f writes bf16 in a bf16 pass
    COHORT_CHECK(params_) << name() << ": a bf16 forward before registerParams";
    wte16_ = params_->halfValue(wteEntry_, gpu.allocator(), gpu.stream());  // a view into the bf16 copy
    gpu.blas().gemmEx(head, {}, bf16, bf16, final16_.raw(), wte16_.raw(), logits.raw());
    return maskPadding(logits, pass);
  }
#endif
  precision::checkCpuPrecision(pass, *this);
  runtime::cpu::gemm(head, f.data(), wte_.weight().data(), logits.data());
  maskPadding(logits, pass);
}

// The padded ids' logits −inf (GptOptions::realVocab): exp(−inf − max) is exactly 0, so each row's
// softmax, loss and gradient are the unpadded row's.
void Gpt::maskPadding(const Tensor& logits, const Pass& pass) {
  const int64_t V = options_.vocab, real = options_.predictedVocab(), rows = batch_ * time_;
  if (real == V) return;
  const float inf = std::numeric_limits<float>::infinity();
#ifdef COHORT_HAVE_CUDA
  if (onGpu(logits)) {
    auto& gpu = gpuFor(pass, logits, name());
    return runtime::cuda::fillColumns(logits.raw(), logits.dtype(), rows, V, real, -inf, gpu.stream());
  }
#endif
  (void)pass;
  for (int64_t r = 0; r < rows; ++r) std::fill(logits.data() + r * V + real, logits.data() + (r + 1) * V, -inf);
}

// dwte = dlogitsᵀ·x (written, or added), d(x) = dlogits·wte: as headForward computed.
void Gpt::headBackward(const Tensor& gradLogits, const Pass& pass) {
  const int64_t B = batch_, T = time_, D = options_.dim, V = options_.vocab;
  const int rows = static_cast<int>(B * T), v = static_cast<int>(V), d = static_cast<int>(D);
  const runtime::GemmOptions weightGrad{.m = v, .n = d, .k = rows, .transA = true, .beta = pass.accumulateGrads ? 1.0f : 0.0f};
  const runtime::GemmOptions inputGrad{.m = rows, .n = d, .k = v};
#ifdef COHORT_HAVE_CUDA
  if (onGpu(gradLogits)) {
    auto& gpu = gpuFor(pass, gradLogits, name());
    runtime::ensureShape(gradFinal_, Shape{B, T, D}, gpu.allocator());
    if (pass.precision != runtime::DType::kBF16) {
      gpu.blas().gemm(weightGrad, gradLogits.data(), final_->data(), wte_.weightGrad().data());
      gpu.blas().gemm(inputGrad, gradLogits.data(), wte_.weight().data(), gradFinal_.data());
      return;
    }
    // The loss writes bf16 in a bf16 pass (Loss::setGradType): then nothing is converted.
    const runtime::DType bf16 = runtime::DType::kBF16, fp32 = runtime::DType::kF32;
    const Tensor& dy = precision::toType(gradLogits, bf16, gradLogits16_, pass, *this);
    gpu.blas().gemmEx(weightGrad, {}, bf16, fp32, dy.raw(), final16_.raw(), wte_.weightGrad().data());
    gpu.blas().gemmEx(inputGrad, {}, bf16, fp32, dy.raw(), wte16_.raw(), gradFinal_.data());
    return;
  }
#endif
  runtime::ensureShape(gradFinal_, Shape{B, T, D});
  runtime::cpu::gemm(weightGrad, gradLogits.data(), final_->data(), wte_.weightGrad().data());
  runtime::cpu::gemm(inputGrad, gradLogits.data(), wte_.weight().data(), gradFinal_.data());
}

const Tensor& Gpt::backward(const Tensor& gradOutput, const Pass& pass) {
  const int64_t B = batch_, T = time_, D = options_.dim, V = options_.vocab;
  COHORT_CHECK(final_ && gradOutput.numel() == B * T * V) << gradOutput.shape().str() << " after a forward of ["
                                                           << B << ", " << T << "]";
  tellUnit(pass, embeddingsUnit_, &UnitListener::beforeBackward);  // the head writes wte's gradient
  headBackward(gradOutput, pass);
#ifdef COHORT_HAVE_CUDA
  runtime::cuda::GpuContext* gpu = onGpu(gradOutput) ? &gpuFor(pass, gradOutput, name()) : nullptr;
#endif
  Pass inner = pass;
  inner.needInputGrad = true;
  // Chained blocks in a bf16 pass on a GPU: each gradient of the residual stream between blocks is
  // written with its bf16 copy (gradStream16_, one buffer: a block reads its copy before it writes
  // the next), which mlp.c_proj's backward reads as it is.
  const bool chained = recomputed_.empty();
  Tensor* copy = chained && onGpu(gradOutput) && pass.precision == runtime::DType::kBF16 && options_.dropout == 0.0f
                     ? &gradStream16_
                     : nullptr;
  const Tensor* g = &backwardOfUnit(pass, lnFUnit_, [&]() -> const Tensor& {
    return lnF_.backwardAdded(gradFinal_, {.out16 = copy}, inner);
  });
  const TransformerBlock* later = nullptr;  // the block whose backward ran last
  for (size_t i = blocks_.size(); i-- > 0;) {
    TransformerBlock& block = *blocks_[i];
    if (later) block.shareBackwardBuffers(*later);  // one set of gradient buffers for every block
    g = &backwardOfUnit(pass, blockUnits_[i], [&]() -> const Tensor& {
      if (!chained) return recomputed_[i]->backward(*g, inner);
      return block.backwardChained({.grad = g, .grad16 = copy, .gradInput16 = i > 0 ? copy : nullptr}, inner);
    });
    later = &block;
  }
  if (options_.dropout > 0.0f) g = &drop_.backward(*g, inner);
  // The position embedding's gradient: d(x) summed over the batch.
#ifdef COHORT_HAVE_CUDA
  if (gpu) {
    runtime::ensureShape(gradPositions_, Shape{T, D}, gpu->allocator());
    const auto n = static_cast<size_t>(T * D);
    runtime::cuda::fill({gradPositions_.data(), n}, 0.0f, gpu->stream());
    for (int64_t b = 0; b < B; ++b) {
      runtime::cuda::axpy(1.0f, {g->data() + b * T * D, n}, {gradPositions_.data(), n}, gpu->stream());
    }
  } else
#endif
  {
    runtime::ensureShape(gradPositions_, Shape{T, D});
    gradPositions_.fill(0.0f);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < T * D; ++i) gradPositions_.data()[i] += g->data()[b * T * D + i];
    }
  }
  Pass embeddings = pass;
  embeddings.needInputGrad = false;  // ids have no gradient
  wpe_.backward(gradPositions_, embeddings);
  embeddings.accumulateGrads = true;  // onto the head's gradient of the same weight
  embeddings.needInputGrad = pass.needInputGrad;
  const Tensor& gradIds = wte_.backward(*g, embeddings);
  tellUnit(pass, embeddingsUnit_, &UnitListener::afterBackward);  // wte's gradient is final only now
  return gradIds;
}

void Gpt::checkInputs(const Pass& pass) const { wte_.checkIds(pass); }

}  // namespace cohort::nn
