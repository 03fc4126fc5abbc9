#include "nn/linear.h"

#include <cmath>

#include "nn/gelu.h"
#include "nn/gpu_dispatch.h"
#include "nn/precision.h"
#include "runtime/cpu/blas.h"
#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/norm_kernels.h"
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
  gradPreActivation_ = peer.gradPreActivation_;
}

std::string Linear::name() const {
  return "Linear(" + std::to_string(options_.in) + " -> " + std::to_string(options_.out) +
         (options_.bias ? "" : ", no bias") + (options_.gelu ? ", GELU)" : ")");
}

void Linear::registerParams(ParamBuffer& params, const std::string& prefix) {
  params_ = &params;
  weightEntry_ = params.add(prefix + "weight", Shape{options_.out, options_.in}, &weight_, &weightGrad_);
  params.declareReadAsBf16(weightEntry_);  // forwardGpu's weight16_, from the bf16 copy
  if (options_.bias) {
    biasEntry_ = params.add(prefix + "bias", Shape{options_.out}, &bias_, &biasGrad_);
    params.declareReadAsBf16(biasEntry_);  // the bf16 copy, or broadcastToBf16
  }
}

void Linear::resetParams(runtime::Rng& rng) { resetByPlan(*this, rng); }

void Linear::planInit(InitPlan& plan) const {
  // PyTorch: kaiming_uniform_(a=sqrt(5)) on the weight gives bound 1/sqrt(fan_in); the bias uses the
  // same bound.
  const float bound = 1.0f / std::sqrt(static_cast<float>(options_.in));
  plan.uniform(weightTarget(), -bound, bound);
  if (options_.bias) plan.uniform(biasTarget(), -bound, bound);
}

InitTarget Linear::weightTarget() const { return initTarget(*this, weightEntry_, options_.out * options_.in, weight_); }

InitTarget Linear::biasTarget() const {
  if (!options_.bias) COHORT_THROW(InvalidArgument) << name() << " has no bias to initialise";
  return initTarget(*this, biasEntry_, options_.out, bias_);
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
  if (onGpu(input)) return forwardGpu(input_, outShape, pass);
#endif
  precision::checkCpuPrecision(pass, *this);
  forwardCpu(outShape);
  return output_;
}

void Linear::forwardCpu(const Shape& outShape) {
  const int64_t rows = input_.dim(0), out = options_.out;
  Tensor& y = options_.gelu ? preActivation_ : output_;
  runtime::ensureShape(y, outShape);
  gemm({.m = static_cast<int>(rows), .n = static_cast<int>(out), .k = static_cast<int>(options_.in), .transB = true},
       input_.data(), weight_.data(), y.data());
  if (options_.bias) {
    const float* b = bias_.data();
    for (int64_t r = 0; r < rows; ++r) {
      float* row = y.data() + r * out;
      for (int64_t j = 0; j < out; ++j) row[j] += b[j];
    }
  }
  if (options_.gelu) {
    runtime::ensureShape(output_, outShape);
    geluForward(y.data(), output_.data(), y.numel());
  }
}

void Linear::shareForwardBuffers(const Linear& peer) {
  output_ = peer.output_;
  preActivation_ = peer.preActivation_;
  inputCast_ = peer.inputCast_;
}

const Tensor& Linear::recomputeGelu() {
  if (!options_.gelu || !preActivation_.defined() || preActivation_.device().isCuda()) {
    COHORT_THROW(InvalidArgument) << name() << ": only a GELU Linear's CPU forward can recompute its GELU";
  }
  runtime::ensureShape(output_, preActivation_.shape());
  geluForward(preActivation_.data(), output_.data(), preActivation_.numel());
  return output_;
}

const Tensor& Linear::backward(const Tensor& gradOutput, const Pass& pass) {
  if (!options_.gelu) return backwardFromPreActivation(gradOutput, pass);
  COHORT_CHECK(gradOutput.numel() == preActivation_.numel()) << gradOutput.shape().str();
  return backwardFromPreActivation(geluBackward(gradOutput, preActivation_, pass), pass);
}

// dU = dY · GELU'(u) into gradPreActivation_, in u's type.
const Tensor& Linear::geluBackward(const Tensor& gradOutput, const Tensor& u, const Pass& pass) {
#ifdef COHORT_HAVE_CUDA
  if (onGpu(u)) {
    auto& gpu = gpuFor(pass, u, *this);
    runtime::ensureShape(gradPreActivation_, u.shape(), gpu.allocator(), u.dtype());
    runtime::cuda::geluBackward(u.raw(), gradOutput.raw(), gradPreActivation_.raw(), u.numel(), gpu.stream(), u.dtype(),
                                gradOutput.dtype());
    return gradPreActivation_;
  }
#endif
  static_cast<void>(pass);
  runtime::ensureShape(gradPreActivation_, u.shape());
  nn::geluBackward(u.data(), gradOutput.data(), gradPreActivation_.data(), u.numel());
  return gradPreActivation_;
}

const Tensor& Linear::backwardThroughGelu(const Tensor& gradOutput, const Pass& pass, const Tensor& geluInput) {
  COHORT_CHECK(geluInput.numel() == input_.numel()) << name() << ": GELU input " << geluInput.shape().str()
                                                    << " for an input of " << inputShape_.str();
  return backwardWith(gradOutput, pass, &geluInput);
}

const Tensor& Linear::backwardFromPreActivation(const Tensor& gradOutput, const Pass& pass) {
  return backwardWith(gradOutput, pass, nullptr);
}

// The parameter gradients from dY, and the input gradient dY · W (through GELU's derivative at
// *geluInput, when given).
const Tensor& Linear::backwardWith(const Tensor& gradOutput, const Pass& pass, const Tensor* geluInput) {
  int64_t rows = input_.dim(0);
  COHORT_CHECK(gradOutput.numel() == rows * options_.out) << gradOutput.shape().str();
#ifdef COHORT_HAVE_CUDA
  if (onGpu(gradOutput)) {
    return pass.precision == runtime::DType::kBF16 ? backwardBf16(gradOutput, pass, geluInput)
                                                    : backwardFp32(gradOutput, pass, geluInput);
  }
#endif
  const float* dy = gradOutput.data();
  int in = static_cast<int>(options_.in), out = static_cast<int>(options_.out), r = static_cast<int>(rows);
  // dW[out, in] = dYᵀ[out, rows] · X[rows, in]
  gemm({.m = out, .n = in, .k = r, .transA = true, .beta = pass.accumulateGrads ? 1.0f : 0.0f}, dy, input_.data(),
       weightGrad_.data());
  if (options_.bias) {
    float* db = biasGrad_.data();
    if (!pass.accumulateGrads) biasGrad_.fill(0.0f);
    for (int64_t i = 0; i < rows; ++i) {
      const float* row = dy + i * out;
      for (int j = 0; j < out; ++j) db[j] += row[j];
    }
  }
  if (!pass.needInputGrad) return gradInput_ = Tensor();
  // dX[rows, in] = dY[rows, out] · W[out, in]
  runtime::ensureShape(gradInput_, inputShape_);
  gemm({.m = r, .n = in, .k = out}, dy, weight_.data(), gradInput_.data());
  if (geluInput) nn::geluBackward(geluInput->data(), gradInput_.data(), gradInput_.data(), gradInput_.numel());
  return gradInput_;
}

#ifdef COHORT_HAVE_CUDA
// y = x · Wᵀ + b (then GELU) in the pass's precision: fp32, or bf16 with x and W rounded to bf16
// (W and b read from the ParamBuffer's bf16 copy),
// fp32 sums and the output rounded once. The bias and GELU run in the product's epilogue where
// cuBLASLt has an algorithm for the shape (the bias rounded to bf16 in a bf16 pass); otherwise the
// bias is written first as the C that the product adds to (bf16) or added after it (fp32), and the
// GELU is a kernel of its own.
const Tensor& Linear::forwardGpu(const Tensor& input2d, const Shape& outShape, const Pass& pass) {
  auto& gpu = gpuFor(pass, input2d, *this);
  using runtime::DType;
  const DType type = pass.precision == DType::kBF16 ? DType::kBF16 : DType::kF32;
  const int64_t rows = input2d.dim(0), out = options_.out;
  const void* w = weight_.data();
  const void* bias = options_.bias ? bias_.data() : nullptr;
  if (type == DType::kBF16) {
    input_ = precision::toType(input2d, DType::kBF16, inputCast_, pass, *this);
    COHORT_CHECK(params_) << name() << ": a bf16 forward before registerParams";
    weight16_ = params_->halfValue(weightEntry_, gpu.allocator(), gpu.stream());
    w = weight16_.raw();
    if (bias) bias = params_->halfValue(biasEntry_, gpu.allocator(), gpu.stream()).raw();
  }
  runtime::ensureShape(output_, outShape, gpu.allocator(), type);
  if (options_.gelu) runtime::ensureShape(preActivation_, outShape, gpu.allocator(), type);
  const runtime::GemmOptions o{.m = static_cast<int>(rows), .n = static_cast<int>(out),
                               .k = static_cast<int>(options_.in), .transB = true};
  const auto epilogue = options_.gelu ? runtime::cuda::GemmEpilogue::kBiasGelu : runtime::cuda::GemmEpilogue::kBias;
  if (bias && gpu.blas().gemmFused(o, epilogue, type, input_.raw(), w, output_.raw(),
                                   {.bias = bias, .aux = options_.gelu ? preActivation_.raw() : nullptr})) {
    return output_;
  }
  Tensor& y = options_.gelu ? preActivation_ : output_;
  if (type == DType::kBF16) {
    if (bias) runtime::cuda::broadcastToBf16(bias_.data(), y.raw(), rows, out, gpu.stream());
    runtime::GemmOptions withBias = o;
    withBias.beta = bias ? 1.0f : 0.0f;
    gpu.blas().gemmEx(withBias, {}, DType::kBF16, DType::kBF16, input_.raw(), w, y.raw());
  } else {
    gpu.blas().gemm(o, input_.data(), weight_.data(), y.data());
    if (bias) {
      runtime::cuda::biasActivation(runtime::cuda::ActivationOp::kIdentity, y.data(), bias_.data(), rows, out,
                                    gpu.stream());
    }
  }
  if (options_.gelu) runtime::cuda::geluForward(y.raw(), output_.raw(), y.numel(), gpu.stream(), type);
  return output_;
}

// dX = dY · W of `type` into gradInput_, through GELU's derivative at *geluInput when given: fused
// into the product where cuBLASLt can, else the product then the GELU backward in place.
void Linear::inputGradGpu(runtime::cuda::GpuContext& gpu, const Tensor& dy, const void* w, runtime::DType type,
                          const Tensor* geluInput) {
  runtime::ensureShape(gradInput_, inputShape_, gpu.allocator(), type);
  const runtime::GemmOptions o{.m = static_cast<int>(input_.dim(0)), .n = static_cast<int>(options_.in),
                               .k = static_cast<int>(options_.out)};
  if (geluInput) {
    COHORT_CHECK(geluInput->dtype() == type) << name() << ": a " << runtime::dtypeName(geluInput->dtype())
                                             << " GELU input in a " << runtime::dtypeName(type) << " backward";
    if (gpu.blas().gemmFused(o, runtime::cuda::GemmEpilogue::kGeluGrad, type, dy.raw(), w, gradInput_.raw(),
                             {.aux = const_cast<void*>(geluInput->raw())})) {
      return;
    }
  }
  if (type == runtime::DType::kBF16) {
    gpu.blas().gemmEx(o, {}, type, type, dy.raw(), w, gradInput_.raw());
  } else {
    gpu.blas().gemm(o, dy.data(), weight_.data(), gradInput_.data());
  }
  if (geluInput) {
    runtime::cuda::geluBackward(geluInput->raw(), gradInput_.raw(), gradInput_.raw(), gradInput_.numel(), gpu.stream(),
                                type, type);
  }
}

// The bias gradient Σ dY over rows (fp32), by the fixed-order reduction.
void Linear::biasGradGpu(runtime::cuda::GpuContext& gpu, const Tensor& dy, const Pass& pass) {
  const runtime::cuda::ChannelSumOptions sum{.outer = input_.dim(0), .channels = options_.out,
                                             .accumulate = pass.accumulateGrads};
  runtime::ensureShape(biasScratch_, Shape{runtime::cuda::channelSumScratchFloats(sum)}, gpu.allocator());
  runtime::cuda::channelSum({.x = dy.raw(), .xType = dy.dtype(), .sums = biasGrad_.data(), .scratch = biasScratch_.data()},
                            sum, gpu.stream());
}

// dW (fp32) = dYᵀ · X (+= when accumulating) from dY and X of the input's type, and with a bias
// db = Σ dY over rows: out of the same product (cuBLASLt's bias-gradient epilogue) where cuBLASLt
// can, else by the fixed-order reduction. The epilogue writes its sum and never adds, so when
// accumulating the sum goes to biasScratch_ and is added to db, as the reduction would.
void Linear::paramGradsGpu(runtime::cuda::GpuContext& gpu, const Tensor& dy, const Pass& pass) {
  using runtime::DType;
  const runtime::GemmOptions o{.m = static_cast<int>(options_.out), .n = static_cast<int>(options_.in),
                               .k = static_cast<int>(input_.dim(0)), .transA = true,
                               .beta = pass.accumulateGrads ? 1.0f : 0.0f};
  const runtime::cuda::GemmTypes types{dy.dtype(), DType::kF32};
  if (options_.bias) {
    if (pass.accumulateGrads) runtime::ensureShape(biasScratch_, Shape{options_.out}, gpu.allocator());
    float* sum = pass.accumulateGrads ? biasScratch_.data() : biasGrad_.data();
    if (gpu.blas().gemmFused(o, runtime::cuda::GemmEpilogue::kBiasGrad, types, dy.raw(), input_.raw(),
                             weightGrad_.data(), {.bias = sum})) {
      const auto n = static_cast<size_t>(options_.out);
      if (pass.accumulateGrads) runtime::cuda::axpy(1.0f, {sum, n}, {biasGrad_.data(), n}, gpu.stream());
      return;
    }
  }
  if (types.ab == DType::kF32) {
    gpu.blas().gemm(o, dy.data(), input_.data(), weightGrad_.data());
  } else {
    gpu.blas().gemmEx(o, {}, types.ab, types.c, dy.raw(), input_.raw(), weightGrad_.data());
  }
  if (options_.bias) biasGradGpu(gpu, dy, pass);
}

const Tensor& Linear::backwardFp32(const Tensor& gradOutput, const Pass& pass, const Tensor* geluInput) {
  auto& gpu = gpuFor(pass, gradOutput, *this);
  paramGradsGpu(gpu, gradOutput, pass);
  if (!pass.needInputGrad) return gradInput_ = Tensor();
  inputGradGpu(gpu, gradOutput, weight_.data(), runtime::DType::kF32, geluInput);
  return gradInput_;
}

// dW (fp32) = dYᵀ · X and db (fp32) = Σ dY from the bf16 dY and X; dX (bf16) = dY · W.
const Tensor& Linear::backwardBf16(const Tensor& gradOutput, const Pass& pass, const Tensor* geluInput) {
  auto& gpu = gpuFor(pass, gradOutput, *this);
  COHORT_CHECK(input_.dtype() == runtime::DType::kBF16) << name() << ": a bf16 backward after an fp32 forward";
  const Tensor& dy = precision::toType(gradOutput, runtime::DType::kBF16, gradCast_, pass, *this);
  paramGradsGpu(gpu, dy, pass);
  if (!pass.needInputGrad) return gradInput_ = Tensor();
  inputGradGpu(gpu, dy, weight16_.raw(), runtime::DType::kBF16, geluInput);
  return gradInput_;
}
#endif

}  // namespace cohort::nn
