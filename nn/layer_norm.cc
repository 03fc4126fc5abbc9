#include "nn/layer_norm.h"

#include <cmath>

#include "nn/gpu_dispatch.h"
#include "nn/precision.h"
#include "nn/residual.h"
#include "runtime/cpu/blas.h"
#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/norm_kernels.h"
#endif

namespace cohort::nn {

LayerNorm::LayerNorm(const LayerNormOptions& o) : features_(o.features), eps_(o.eps), hasBias_(o.bias) {
  if (o.features < 1 || !(o.eps > 0.0)) {
    COHORT_THROW(InvalidArgument) << "LayerNorm needs features >= 1 and eps > 0; got " << o.features << ", " << o.eps;
  }
}

void LayerNorm::placeZeroBias(const Pass& pass) {
  if (hasBias_ || (bias_.defined() && bias_.device() == input_.device())) return;
  const Shape shape{features_};
#ifdef COHORT_HAVE_CUDA
  if (onGpu(input_)) {
    auto& gpu = gpuFor(pass, input_, name());
    bias_ = Tensor::zeros(shape).clone(gpu.allocator());
    biasGrad_ = Tensor::zeros(shape).clone(gpu.allocator());
    return;
  }
#endif
  (void)pass;
  bias_ = Tensor::zeros(shape);
  biasGrad_ = Tensor::zeros(shape);
}

std::string LayerNorm::name() const { return "LayerNorm(" + std::to_string(features_) + ")"; }

void LayerNorm::registerParams(ParamBuffer& params, const std::string& prefix) {
  weightEntry_ = params.add(prefix + "weight", Shape{features_}, &weight_, &weightGrad_);
  if (hasBias_) biasEntry_ = params.add(prefix + "bias", Shape{features_}, &bias_, &biasGrad_);
}

void LayerNorm::resetParams(runtime::Rng& rng) { resetByPlan(*this, rng); }

void LayerNorm::planInit(InitPlan& plan) const {
  plan.constant(initTarget(*this, weightEntry_, features_, weight_), 1.0f);
  if (hasBias_) plan.constant(initTarget(*this, biasEntry_, features_, bias_), 0.0f);
}

Shape LayerNorm::outputShape(const Shape& input) const {
  if (input.rank() < 1 || input[input.rank() - 1] != features_) {
    COHORT_THROW(InvalidArgument) << name() << " normalises a last dimension of " << features_ << ", got input "
                                  << input.str();
  }
  return input;
}

const Tensor& LayerNorm::forward(const Tensor& input, const Pass& pass) {
  outputShape(input.shape());
  input_ = input;
  rows_ = input.numel() / features_;
  placeZeroBias(pass);
  if (onGpu(input)) return forwardGpu(pass, nullptr);
  precision::checkCpuPrecision(pass, *this);
  runtime::ensureShape(output_, input.shape());
  runtime::ensureShape(mean_, Shape{rows_});
  runtime::ensureShape(rstd_, Shape{rows_});
  layerNormRows(input.data(), rows_, features_, weight_.data(), bias_.data(), eps_, output_.data(), mean_.data(),
                rstd_.data());
  return output_;
}

const Tensor& LayerNorm::forwardAdded(const ResidualAdd& add, const Pass& pass) {
  if (!onGpu(add.residual)) {
    addInto(add.sum, add.residual, add.branch, pass);
    return forward(add.sum, pass);
  }
  COHORT_CHECK(add.branch.shape() == add.residual.shape() && add.residual.dtype() == runtime::DType::kF32)
      << name() << ": adding " << add.branch.shape().str() << " to a residual stream of " << add.residual.shape().str();
  outputShape(add.residual.shape());
  input_ = add.residual;  // replaced by the sum once it is sized
  rows_ = add.residual.numel() / features_;
  placeZeroBias(pass);
  return forwardGpu(pass, &add);
}

const Tensor& LayerNorm::backwardAdded(const Tensor& gradOutput, const ResidualGrad& grad, const Pass& pass) {
  COHORT_CHECK(pass.needInputGrad) << name() << ": an added backward needs the input gradient";
  if (onGpu(gradOutput)) {
    COHORT_CHECK(gradOutput.numel() == input_.numel())
        << name() << ": gradient " << gradOutput.shape().str() << " for input " << input_.shape().str();
    return backwardGpu(gradOutput, pass, grad);
  }
  const Tensor& gradInput = backward(gradOutput, pass);
  if (grad.residualGrad == nullptr) return grad.out != nullptr ? (*grad.out = gradInput) : gradInput;
  Tensor& out = grad.out != nullptr ? *grad.out : gradInput_;  // addInto may write over its second input
  addInto(out, *grad.residualGrad, gradInput, pass);
  return out;
}

namespace {

void layerNormRowRange(const float* x, int64_t first, int64_t last, int64_t features, const float* weight,
                       const float* bias, double eps, float* y, float* mean, float* rstd) {
  for (int64_t r = first; r < last; ++r) {
    const float* xr = x + r * features;
    float* yr = y + r * features;
    // Two passes in double: the mean, then the squared deviations from it.
    double sum = 0.0;
    for (int64_t c = 0; c < features; ++c) sum += xr[c];
    const double m = sum / static_cast<double>(features);
    double sq = 0.0;
    for (int64_t c = 0; c < features; ++c) sq += (xr[c] - m) * (xr[c] - m);
    const double var = sq / static_cast<double>(features);
    const float meanF = static_cast<float>(m);
    const float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
    if (mean) mean[r] = meanF;
    if (rstd) rstd[r] = inv;
    for (int64_t c = 0; c < features; ++c) yr[c] = weight[c] * ((xr[c] - meanF) * inv) + bias[c];
  }
}

}  // namespace

void layerNormRows(const float* x, int64_t rows, int64_t features, const float* weight, const float* bias, double eps,
                   float* y, float* mean, float* rstd) {
  runtime::cpu::parallelRange(rows, runtime::cpu::rowGrain(features), [&](int64_t first, int64_t last, int) {
    layerNormRowRange(x, first, last, features, weight, bias, eps, y, mean, rstd);
  });
}

const Tensor& LayerNorm::backward(const Tensor& gradOutput, const Pass& pass) {
  COHORT_CHECK(gradOutput.numel() == input_.numel())
      << name() << ": gradient " << gradOutput.shape().str() << " for input " << input_.shape().str();
  if (onGpu(gradOutput)) return backwardGpu(gradOutput, pass, {});
  if (pass.needInputGrad) {
    runtime::ensureShape(gradInput_, input_.shape());
  } else {
    gradInput_ = Tensor();
  }
  const float* w = weight_.data();
  const float* dy = gradOutput.data();
  const float* x = input_.data();
  // dweight and dbias: column sums over every row, in double, rows in order (each column's sum
  // runs down the rows; the rows are walked in memory order, a row's columns side by side). With
  // several threads (runtime::cpu::parallelRange) each chunk of rows sums into its own columns,
  // which are then added in chunk order: the same bits for the same thread count.
  const int64_t grain = runtime::cpu::rowGrain(features_);
  const auto chunks = static_cast<size_t>(runtime::cpu::parallelChunks(rows_, grain));
  const auto width = 2 * static_cast<size_t>(features_);
  columnSums_.assign(chunks * width, 0.0);
  const float* mean = mean_.data();
  const float* rstd = rstd_.data();
  runtime::cpu::parallelRange(rows_, grain, [&](int64_t first, int64_t last, int chunk) {
    double* sumW = columnSums_.data() + static_cast<size_t>(chunk) * width;
    double* sumB = sumW + features_;
    for (int64_t r = first; r < last; ++r) {
      const float* xr = x + r * features_;
      const float* dyr = dy + r * features_;
      const float meanF = mean[r], inv = rstd[r];
      for (int64_t c = 0; c < features_; ++c) {
        const float xhat = (xr[c] - meanF) * inv;
        sumW[c] += static_cast<double>(dyr[c]) * xhat;
        sumB[c] += dyr[c];
      }
    }
  });
  double* sumW = columnSums_.data();
  double* sumB = sumW + features_;
  for (size_t k = 1; k < chunks; ++k) {
    for (size_t c = 0; c < width; ++c) sumW[c] += columnSums_[k * width + c];
  }
  for (int64_t c = 0; c < features_; ++c) {
    if (pass.accumulateGrads) {
      weightGrad_.at(c) += static_cast<float>(sumW[c]);
      biasGrad_.at(c) += static_cast<float>(sumB[c]);
    } else {
      weightGrad_.at(c) = static_cast<float>(sumW[c]);
      biasGrad_.at(c) = static_cast<float>(sumB[c]);
    }
  }
  if (!pass.needInputGrad) return gradInput_;
  // The row's mean and variance depend on every x of the row: with g = dy · weight,
  // dx = rstd · (g − mean(g) − xhat · mean(g · xhat)).
  float* gradInput = gradInput_.data();
  runtime::cpu::parallelRange(rows_, grain, [&](int64_t first, int64_t last, int) {
    for (int64_t r = first; r < last; ++r) {
      const float* xr = x + r * features_;
      const float* dyr = dy + r * features_;
      float* dx = gradInput + r * features_;
      const float meanF = mean[r], inv = rstd[r];
      double sumG = 0.0, sumGXhat = 0.0;
      for (int64_t c = 0; c < features_; ++c) {
        const float g = dyr[c] * w[c];
        const float xhat = (xr[c] - meanF) * inv;
        sumG += g;
        sumGXhat += static_cast<double>(g) * xhat;
      }
      const float meanG = static_cast<float>(sumG / static_cast<double>(features_));
      const float meanGXhat = static_cast<float>(sumGXhat / static_cast<double>(features_));
      for (int64_t c = 0; c < features_; ++c) {
        const float g = dyr[c] * w[c];
        const float xhat = (xr[c] - meanF) * inv;
        dx[c] = inv * (g - meanG - xhat * meanGXhat);
      }
    }
  });
  return gradInput_;
}

#ifdef COHORT_HAVE_CUDA

// With `add`, the input is add->residual + add->branch, written to add->sum by the same kernel.
const Tensor& LayerNorm::forwardGpu(const Pass& pass, const ResidualAdd* add) {
  auto& gpu = gpuFor(pass, input_, name());
  if (add != nullptr) {
    runtime::ensureShape(add->sum, add->residual.shape(), gpu.allocator());
    input_ = add->sum;
  }
  runtime::ensureShape(output_, input_.shape(), gpu.allocator(), pass.precision);
  runtime::ensureShape(mean_, Shape{rows_}, gpu.allocator());
  runtime::ensureShape(rstd_, Shape{rows_}, gpu.allocator());
  runtime::cuda::layerNormForward({.x = add != nullptr ? add->residual.raw() : input_.raw(),
                                   .branch = add != nullptr ? add->branch.raw() : nullptr,
                                   .sum = add != nullptr ? add->sum.data() : nullptr,
                                   .weight = weight_.data(),
                                   .bias = bias_.data(),
                                   .y = output_.raw(),
                                   .mean = mean_.data(),
                                   .rstd = rstd_.data(),
                                   .xType = add != nullptr ? add->residual.dtype() : input_.dtype(),
                                   .yType = output_.dtype(),
                                   .branchType = add != nullptr ? add->branch.dtype() : input_.dtype()},
                                  {.rows = rows_, .cols = features_, .eps = eps_}, gpu.stream());
  return output_;
}

// The input gradient into gradInput_, or with grad.out into *grad.out (plus grad.residualGrad,
// and the bf16 copy into *grad.out16 in a bf16 pass).
const Tensor& LayerNorm::backwardGpu(const Tensor& gradOutput, const Pass& pass, const ResidualGrad& grad) {
  auto& gpu = gpuFor(pass, gradOutput, name());
  Tensor& dx = grad.out != nullptr ? *grad.out : gradInput_;
  if (pass.needInputGrad) {
    runtime::ensureShape(dx, input_.shape(), gpu.allocator(), input_.dtype());
  } else {
    gradInput_ = Tensor();
  }
  const bool copy16 = grad.out16 != nullptr && pass.precision == runtime::DType::kBF16;
  if (copy16) runtime::ensureShape(*grad.out16, input_.shape(), gpu.allocator(), runtime::DType::kBF16);
  if (grad.residualGrad != nullptr) {
    COHORT_CHECK(grad.residualGrad->numel() == input_.numel() && grad.residualGrad->dtype() == runtime::DType::kF32 &&
                 input_.dtype() == runtime::DType::kF32)
        << name() << ": a residual gradient of " << grad.residualGrad->shape().str() << " for an input of "
        << input_.shape().str();
  }
  runtime::ensureShape(scratch_, Shape{runtime::cuda::layerNormScratchFloats(rows_, features_)}, gpu.allocator());
  runtime::cuda::layerNormBackward({.dy = gradOutput.raw(),
                                    .x = input_.raw(),
                                    .weight = weight_.data(),
                                    .mean = mean_.data(),
                                    .rstd = rstd_.data(),
                                    .dweight = weightGrad_.data(),
                                    .dbias = biasGrad_.data(),
                                    .dx = pass.needInputGrad ? dx.raw() : nullptr,
                                    .residualGrad = grad.residualGrad != nullptr ? grad.residualGrad->data() : nullptr,
                                    .dx16 = copy16 ? grad.out16->raw() : nullptr,
                                    .scratch = scratch_.data(),
                                    .dyType = gradOutput.dtype(),
                                    .xType = input_.dtype()},
                                   {.rows = rows_, .cols = features_, .accumulate = pass.accumulateGrads},
                                   gpu.stream());
  return pass.needInputGrad ? dx : gradInput_;
}

#else

const Tensor& LayerNorm::forwardGpu(const Pass& pass, const ResidualAdd*) {
  COHORT_THROW(InvalidArgument) << name() << " got a tensor on " << input_.device().str() << " in a build without CUDA";
}

const Tensor& LayerNorm::backwardGpu(const Tensor&, const Pass& pass, const ResidualGrad&) {
  return forwardGpu(pass, nullptr);
}

#endif

}  // namespace cohort::nn
