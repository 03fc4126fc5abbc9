#include "nn/residual.h"

#include <utility>

#include "nn/gpu_dispatch.h"
#include "runtime/cpu/blas.h"
#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/precision_kernels.h"
#endif

namespace cohort::nn {

void addInto(Tensor& out, const Tensor& a, const Tensor& b, const Pass& pass) {
#ifdef COHORT_HAVE_CUDA
  if (onGpu(a)) {
    auto& gpu = gpuFor(pass, a, "Residual");
    runtime::ensureShape(out, a.shape(), gpu.allocator());
    runtime::cuda::addMixed(a.data(), b.raw(), b.dtype(), out.data(), a.numel(), gpu.stream());
    return;
  }
#endif
  runtime::ensureShape(out, a.shape());
  const float* x = a.data();
  const float* y = b.data();
  float* z = out.data();
  runtime::cpu::parallelRange(a.numel(), runtime::cpu::kParallelGrain, [&](int64_t first, int64_t last, int) {
    for (int64_t i = first; i < last; ++i) z[i] = x[i] + y[i];
  });
}

Residual::Residual(ModulePtr f, std::string name) : f_(std::move(f)), name_(std::move(name)) {
  if (!f_) COHORT_THROW(InvalidArgument) << "Residual needs a module to wrap, got none";
}

void Residual::registerParams(ParamBuffer& params, const std::string& prefix) {
  const std::string fPrefix = name_.empty() ? prefix : prefix + name_ + ".";
  // The unit is named like its parameters' prefix; at the very top with no name, "f" names it.
  params.beginUnit(fPrefix.empty() ? "f" : fPrefix.substr(0, fPrefix.size() - 1));
  const size_t first = params.entries().size();
  f_->registerParams(params, fPrefix);
  fEntries_ = params.entries().size() - first;
  unit_ = params.endUnit();
}

Shape Residual::outputShape(const Shape& input) const {
  Shape inner = f_->outputShape(input);
  if (inner != input) {
    COHORT_THROW(InvalidArgument) << name() << " needs f to keep its input's shape, but f maps " << input.str()
                                  << " to " << inner.str();
  }
  return input;
}

const Tensor& Residual::forward(const Tensor& input, const Pass& pass) {
  const Tensor& fx = forwardOfUnit(pass, unit_, [&]() -> const Tensor& { return f_->forward(input, pass); });
  if (fx.shape() != input.shape() || fx.device() != input.device()) {
    COHORT_THROW(InvalidArgument) << name() << " needs f to keep its input's shape and device, but f maps "
                                  << input.shape().str() << " on " << input.device().str() << " to " << fx.shape().str()
                                  << " on " << fx.device().str();
  }
  addInto(output_, input, fx, pass);
  return output_;
}

const Tensor& Residual::backward(const Tensor& gradOutput, const Pass& pass) {
  COHORT_CHECK(gradOutput.shape() == output_.shape()) << gradOutput.shape().str() << " vs " << output_.shape().str();
  // f's input gradient is only needed for ours; its parameter gradients do not depend on it.
  const Tensor& fGrad = backwardOfUnit(pass, unit_, [&]() -> const Tensor& { return f_->backward(gradOutput, pass); });
  if (!pass.needInputGrad) return none_;  // gradInput_ keeps its memory for the next pass that needs it
  if (fGrad.shape() != gradOutput.shape()) {
    COHORT_THROW(InvalidArgument) << name() << ": f's backward returned an input gradient of " << fGrad.shape().str()
                                  << " for an input of " << gradOutput.shape().str();
  }
  addInto(gradInput_, gradOutput, fGrad, pass);
  return gradInput_;
}

}  // namespace cohort::nn
