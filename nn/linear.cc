#include "nn/linear.h"

#include <cmath>

#include "nn/gpu_dispatch.h"
#include "nn/precision.h"
#include "runtime/cpu/blas.h"
#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/precision_kernels.h"
#include "runtime/cuda/reduce_kernels.h"
#endif

namespace cohort::nn {

using runtime::cpu::gemm;

Linear::Linear(const LinearOptions& options) : options_(options) {
  if (options.in <= 0 || options.out <= 0) {
    COHORT_THROW(InvalidArgument) << "Linear needs positive sizes, got " << options.in << " -> " << options.out;
  }
}

void Linear::shareBackwardBuffers(const Linear& peer) {
  gradInput_ = peer.gradInput_;
  gradCast_ = peer.gradCast_;
  biasScratch_ = peer.biasScratch_;
}

std::string Linear::name() const {
  return "Linear(" + std::to_string(options_.in) + " -> " + std::to_string(options_.out) +
         (options_.bias ? ")" : ", no bias)");
}

void Linear::registerParams(ParamBuffer& params, const std::string& prefix) {
  params.add(prefix + "weight", Shape{options_.out, options_.in}, &weight_, &weightGrad_);
  if (options_.bias) params.add(prefix + "bias", Shape{options_.out}, &bias_, &biasGrad_);
}

void Linear::resetParams(runtime::Rng& rng) {
  // PyTorch: kaiming_uniform_(a=sqrt(5)) on the weight gives bound 1/sqrt(fan_in); the bias uses the
  // same bound.
  float bound = 1.0f / std::sqrt(static_cast<float>(options_.in));
  for (int64_t i = 0; i < weight_.numel(); ++i) weight_.at(i) = rng.uniform(-bound, bound);
  if (options_.bias) {
    for (int64_t i = 0; i < bias_.numel(); ++i) bias_.at(i) = rng.uniform(-bound, bound);
  }
}

Shape Linear::outputShape(const Shape& input) const {
  if (input.rank() < 1 || input[input.rank() - 1] != options_.in) {
    COHORT_THROW(InvalidArgument) << name() << " got input of shape " << input.str();
  }
  Shape s = input;
  s[s.rank() - 1] = options_.out;
  return s;
}

const Tensor& Linear::forward(const Tensor& input, const Pass& pass) {
  Shape outShape = outputShape(input.shape());
  int64_t rows = input.numel() / options_.in;
  inputShape_ = input.shape();
  input_ = input.reshape(Shape{rows, options_.in});
#ifdef COHORT_HAVE_CUDA
  if (onGpu(input)) {
    if (pass.precision == runtime::DType::kBF16) return forwardBf16(input_, outShape, pass);
    auto& gpu = gpuFor(pass, input, name());
    runtime::ensureShape(output_, outShape, gpu.allocator());
    gpu.blas().gemm({.m = static_cast<int>(rows), .n = static_cast<int>(options_.out),
                     .k = static_cast<int>(options_.in), .transB = true},
                    input_.data(), weight_.data(), output_.data());
    if (options_.bias) {
      runtime::cuda::biasActivation(runtime::cuda::ActivationOp::kIdentity, output_.data(), bias_.data(), rows,
                                    options_.out, gpu.stream());
    }
    return output_;
  }
#endif
  precision::checkCpuPrecision(pass, *this);
  runtime::ensureShape(output_, outShape);
  float* y = output_.data();
  gemm({.m = static_cast<int>(rows), .n = static_cast<int>(options_.out), .k = static_cast<int>(options_.in),
        .transB = true},
       input_.data(), weight_.data(), y);
  if (options_.bias) {
    const float* b = bias_.data();
    int64_t out = options_.out;
    for (int64_t r = 0; r < rows; ++r) {
      float* row = y + r * out;
      for (int64_t j = 0; j < out; ++j) row[j] += b[j];
    }
  }
  return output_;
}

const Tensor& Linear::backward(const Tensor& gradOutput, const Pass& pass) {
  int64_t rows = input_.dim(0);
  COHORT_CHECK(gradOutput.numel() == rows * options_.out) << gradOutput.shape().str();
#ifdef COHORT_HAVE_CUDA
  if (onGpu(gradOutput) && pass.precision == runtime::DType::kBF16) return backwardBf16(gradOutput, pass);
#endif
  const float* dy = gradOutput.data();
  int in = static_cast<int>(options_.in), out = static_cast<int>(options_.out), r = static_cast<int>(rows);
  float beta = pass.accumulateGrads ? 1.0f : 0.0f;
#ifdef COHORT_HAVE_CUDA
  if (onGpu(gradOutput)) {
    auto& gpu = gpuFor(pass, gradOutput, name());
    gpu.blas().gemm({.m = out, .n = in, .k = r, .transA = true, .beta = beta}, dy, input_.data(), weightGrad_.data());
    if (options_.bias) {
      const runtime::cuda::ChannelSumOptions sum{.outer = rows, .channels = options_.out, .accumulate = pass.accumulateGrads};
      runtime::ensureShape(biasScratch_, Shape{runtime::cuda::channelSumScratchFloats(sum)}, gpu.allocator());
      runtime::cuda::channelSum({.x = dy, .sums = biasGrad_.data(), .scratch = biasScratch_.data()}, sum, gpu.stream());
    }
    if (!pass.needInputGrad) {
      gradInput_ = Tensor();
      return gradInput_;
    }
    runtime::ensureShape(gradInput_, inputShape_, gpu.allocator());
    gpu.blas().gemm({.m = r, .n = in, .k = out}, dy, weight_.data(), gradInput_.data());
    return gradInput_;
  }
#endif
  // dW[out, in] = dYᵀ[out, rows] · X[rows, in]
  gemm({.m = out, .n = in, .k = r, .transA = true, .beta = beta}, dy, input_.data(), weightGrad_.data());
  if (options_.bias) {
    float* db = biasGrad_.data();
    if (!pass.accumulateGrads) biasGrad_.fill(0.0f);
    for (int64_t i = 0; i < rows; ++i) {
      const float* row = dy + i * out;
      for (int j = 0; j < out; ++j) db[j] += row[j];
    }
  }
  if (!pass.needInputGrad) {
    gradInput_ = Tensor();
    return gradInput_;
  }
  // dX[rows, in] = dY[rows, out] · W[out, in]
  runtime::ensureShape(gradInput_, inputShape_);
  gemm({.m = r, .n = in, .k = out}, dy, weight_.data(), gradInput_.data());
  return gradInput_;
}

#ifdef COHORT_HAVE_CUDA
// y = x · Wᵀ + b with x and W in bf16: the bias (rounded to bf16) is written first as the C that
// the product adds to, so the output is rounded once more, at the end of the fp32 sums.
const Tensor& Linear::forwardBf16(const Tensor& input2d, const Shape& outShape, const Pass& pass) {
  auto& gpu = gpuFor(pass, input2d, name());
  const int64_t rows = input2d.dim(0);
  input_ = precision::toType(input2d, runtime::DType::kBF16, inputCast_, pass, *this);
  runtime::ensureShape(weight16_, weight_.shape(), gpu.allocator(), runtime::DType::kBF16);
  runtime::cuda::convertToBf16(weight_.data(), weight16_.raw(), weight_.numel(), gpu.stream());
  runtime::ensureShape(output_, outShape, gpu.allocator(), runtime::DType::kBF16);
  if (options_.bias) runtime::cuda::broadcastToBf16(bias_.data(), output_.raw(), rows, options_.out, gpu.stream());
  gpu.blas().gemmEx({.m = static_cast<int>(rows), .n = static_cast<int>(options_.out), .k = static_cast<int>(options_.in),
                     .transB = true, .beta = options_.bias ? 1.0f : 0.0f},
                    {}, runtime::DType::kBF16, runtime::DType::kBF16, input_.raw(), weight16_.raw(), output_.raw());
  return output_;
}

// dW (fp32) = dYᵀ · X and db (fp32) = Σ dY from the bf16 dY and X; dX (bf16) = dY · W.
const Tensor& Linear::backwardBf16(const Tensor& gradOutput, const Pass& pass) {
  auto& gpu = gpuFor(pass, gradOutput, name());
  COHORT_CHECK(input_.dtype() == runtime::DType::kBF16) << name() << ": a bf16 backward after an fp32 forward";
  const int in = static_cast<int>(options_.in), out = static_cast<int>(options_.out);
  const int rows = static_cast<int>(input_.dim(0));
  const Tensor& dy = precision::toType(gradOutput, runtime::DType::kBF16, gradCast_, pass, *this);
  const runtime::DType bf16 = runtime::DType::kBF16, fp32 = runtime::DType::kF32;
  gpu.blas().gemmEx({.m = out, .n = in, .k = rows, .transA = true, .beta = pass.accumulateGrads ? 1.0f : 0.0f}, {}, bf16,
                    fp32, dy.raw(), input_.raw(), weightGrad_.data());
  if (options_.bias) {
    const runtime::cuda::ChannelSumOptions sum{.outer = rows, .channels = options_.out, .accumulate = pass.accumulateGrads};
    runtime::ensureShape(biasScratch_, Shape{runtime::cuda::channelSumScratchFloats(sum)}, gpu.allocator());
    runtime::cuda::channelSum({.x = dy.raw(), .xType = bf16, .sums = biasGrad_.data(), .scratch = biasScratch_.data()},
                              sum, gpu.stream());
  }
  if (!pass.needInputGrad) return gradInput_ = Tensor();
  runtime::ensureShape(gradInput_, inputShape_, gpu.allocator(), bf16);
  gpu.blas().gemmEx({.m = rows, .n = in, .k = out}, {}, bf16, bf16, dy.raw(), weight16_.raw(), gradInput_.raw());
  return gradInput_;
}
#endif

}  // namespace cohort::nn
