#include "nn/embedding.h"

#include <cmath>
#include <cstring>

#include "nn/gpu_dispatch.h"
#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/embedding_kernels.h"
#endif

namespace cohort::nn {

Embedding::Embedding(const EmbeddingOptions& options) : options_(options) {
  if (options.vocab <= 0 || options.dim <= 0) {
    COHORT_THROW(InvalidArgument) << "Embedding needs positive sizes, got vocab " << options.vocab << ", dim "
                                  << options.dim;
  }
  if (!(options.initStd >= 0.0f) || !std::isfinite(options.initStd)) {
    COHORT_THROW(InvalidArgument) << "Embedding's initStd must be finite and >= 0, got " << options.initStd;
  }
}

std::string Embedding::name() const {
  return "Embedding(" + std::to_string(options_.vocab) + ", " + std::to_string(options_.dim) + ")";
}

void Embedding::registerParams(ParamBuffer& params, const std::string& prefix) {
  weightEntry_ = params.add(prefix + "weight", Shape{options_.vocab, options_.dim}, &weight_, &weightGrad_);
}

void Embedding::resetParams(runtime::Rng& rng) { resetByPlan(*this, rng); }

void Embedding::planInit(InitPlan& plan) const {
  // GPT-2 (and torch.nn.init.normal_): independent normal(0, std) draws.
  plan.normal(initTarget(*this, weightEntry_, options_.vocab * options_.dim, weight_), options_.initStd,
              InitPlan::NormalScale::kDouble);
}

Shape Embedding::outputShape(const Shape& input) const {
  if (input.rank() >= runtime::kMaxDims) {
    COHORT_THROW(InvalidArgument) << name() << " got ids of shape " << input.str() << ": the output would need "
                                  << input.rank() + 1 << " dimensions, more than " << runtime::kMaxDims;
  }
  Shape s = input;
  s.push(options_.dim);
  return s;
}

// The rule the kernels share (runtime/cuda/embedding_kernels.cu): NaN fails the first test, and
// the bound keeps the conversion to int64 defined.
int64_t Embedding::rowOf(float id, int64_t position, const Shape& shape) const {
  if (id >= 0.0f && std::floor(id) == id && id < 1.0e18f && static_cast<int64_t>(id) < options_.vocab) {
    return static_cast<int64_t>(id);
  }
  COHORT_THROW(InvalidArgument) << name() << ": the id at position " << position << " of ids " << shape.str() << " is "
                                << id << ", not a whole number in [0, " << options_.vocab << ")";
}

const Tensor& Embedding::forward(const Tensor& input, const Pass& pass) {
  const Shape outShape = outputShape(input.shape());
  const int64_t n = input.numel(), dim = options_.dim;
  input_ = input;
#ifdef COHORT_HAVE_CUDA
  if (onGpu(input)) {
    auto& gpu = gpuFor(pass, input, name());
    if (weight_.device() != input.device()) {
      COHORT_THROW(InvalidArgument) << name() << " has its table on " << weight_.device().str() << " but got ids on "
                                    << input.device().str();
    }
    runtime::ensureShape(output_, outShape, gpu.allocator());
    runtime::ensureShape(badIds_, Shape{1}, gpu.allocator());
    runtime::cuda::fill({badIds_.data(), 1}, 0.0f, gpu.stream());
    runtime::cuda::embeddingForward({.ids = input.data(),
                                     .n = n,
                                     .vocab = options_.vocab,
                                     .dim = dim,
                                     .weight = weight_.data(),
                                     .out = output_.data(),
                                     .badCount = reinterpret_cast<uint32_t*>(badIds_.data())},
                                    gpu.stream());
    return output_;
  }
#endif
  if (weight_.device().isCuda()) {
    COHORT_THROW(InvalidArgument) << name() << " has its table on " << weight_.device().str()
                                  << " but got ids on the CPU";
  }
  rows_.resize(static_cast<size_t>(n));  // keeps its capacity: no allocation in a steady loop
  for (int64_t i = 0; i < n; ++i) rows_[static_cast<size_t>(i)] = rowOf(input.at(i), i, input.shape());
  runtime::ensureShape(output_, outShape);
  const float* w = weight_.data();
  float* y = output_.data();
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(y + i * dim, w + rows_[static_cast<size_t>(i)] * dim, static_cast<size_t>(dim) * sizeof(float));
  }
  return output_;
}

const Tensor& Embedding::backward(const Tensor& gradOutput, const Pass& pass) {
  const int64_t n = input_.numel(), dim = options_.dim;
  COHORT_CHECK(gradOutput.numel() == n * dim) << gradOutput.shape().str() << " for ids " << input_.shape().str();
#ifdef COHORT_HAVE_CUDA
  if (onGpu(gradOutput)) {
    auto& gpu = gpuFor(pass, gradOutput, name());
    // Same shape every step: the caching allocator's block is reused, nothing is allocated.
    runtime::ensureShape(backwardScratch_, Shape{runtime::cuda::embeddingBackwardScratchWords(n, options_.vocab)},
                         gpu.allocator());
    runtime::cuda::embeddingBackward({.ids = input_.data(),
                                      .n = n,
                                      .vocab = options_.vocab,
                                      .dim = dim,
                                      .gradOut = gradOutput.data(),
                                      .gradWeight = weightGrad_.data(),
                                      .accumulate = pass.accumulateGrads,
                                      .scratch = reinterpret_cast<uint32_t*>(backwardScratch_.data())},
                                     gpu.stream());
    if (!pass.needInputGrad) return gradInput_ = Tensor();
    runtime::ensureShape(gradInput_, input_.shape(), gpu.allocator());
    runtime::cuda::fill({gradInput_.data(), static_cast<size_t>(n)}, 0.0f, gpu.stream());
    return gradInput_;
  }
#endif
  COHORT_CHECK_EQ(rows_.size(), static_cast<size_t>(n)) << "(backward without a successful forward)";
  // Positions in increasing order, so a repeated id's sum has the same bits every run (and the GPU's).
  if (!pass.accumulateGrads) weightGrad_.fill(0.0f);
  const float* dy = gradOutput.data();
  float* dw = weightGrad_.data();
  for (int64_t i = 0; i < n; ++i) {
    const float* src = dy + i * dim;
    float* dst = dw + rows_[static_cast<size_t>(i)] * dim;
    for (int64_t d = 0; d < dim; ++d) dst[d] += src[d];
  }
  if (!pass.needInputGrad) return gradInput_ = Tensor();
  runtime::ensureShape(gradInput_, input_.shape());
  gradInput_.fill(0.0f);  // the output does not change with the ids where it is defined
  return gradInput_;
}

void Embedding::checkIds(const Pass& pass) const {
#ifdef COHORT_HAVE_CUDA
  if (input_.defined() && onGpu(input_)) {
    auto& gpu = gpuFor(pass, input_, name());
    gpu.stream().synchronize();
    const Tensor count = badIds_.clone();
    uint32_t bad = 0;
    std::memcpy(&bad, count.data(), sizeof(bad));
    if (bad == 0) return;
    const Tensor ids = input_.clone();
    for (int64_t i = 0; i < ids.numel(); ++i) rowOf(ids.at(i), i, ids.shape());  // throws at the first
    COHORT_CHECK(false) << name() << ": the device counted " << bad << " bad ids but the host finds none";
  }
#endif
  (void)pass;
}

}  // namespace cohort::nn
