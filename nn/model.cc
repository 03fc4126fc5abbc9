#include "nn/model.h"

#include "nn/gpu_dispatch.h"
#include "nn/precision.h"
#include "runtime/error.h"

namespace cohort::nn {

Model::Model(ModulePtr network, ModelInfo info)
    : name(std::move(info.name)), sampleShape(info.sampleShape), outputs(info.outputs), net(std::move(network)) {
  if (!net) COHORT_THROW(InvalidArgument) << "model '" << name << "' has no network";
  if (name.empty()) COHORT_THROW(InvalidArgument) << "a model needs a name (it identifies it in checkpoints)";
  net->registerParams(params, "");
}

namespace {

// A bf16 pass on a GPU over parameters of which some are read rounded (ParamBuffer::Entry::
// readAsBf16): the bf16 copy opened for the pass (ParamBuffer::openHalfPass), closed at its end,
// exceptions included.
class HalfPassScope {
 public:
  HalfPassScope(ParamBuffer& params, const Pass& pass, ParamBuffer::HalfPass kind) {
#ifdef COHORT_HAVE_CUDA
    if (pass.precision != runtime::DType::kBF16 || !pass.gpu || !params.bound() || !params.readsAnyAsBf16()) return;
    params.openHalfPass(kind, pass.gpu->allocator(), pass.gpu->stream());
    params_ = &params;
#else
    (void)params, (void)pass, (void)kind;
#endif
  }
  ~HalfPassScope() {
    if (params_) params_->closeHalfPass();
  }
  HalfPassScope(const HalfPassScope&) = delete;
  HalfPassScope& operator=(const HalfPassScope&) = delete;

 private:
  ParamBuffer* params_ = nullptr;
};

}  // namespace

const Tensor& Model::forward(const Tensor& input, const Pass& pass, bool keepBf16) {
  HalfPassScope half(params, pass, ParamBuffer::HalfPass::kForward);
  const Tensor& out = net->forward(input, pass);
  return keepBf16 ? out : precision::toFp32(out, outputCast_, pass, *net);
}

const Tensor& Model::backward(const Tensor& gradOutput, const Pass& pass) {
  HalfPassScope half(params, pass, ParamBuffer::HalfPass::kBackward);
  return net->backward(gradOutput, pass);
}

}  // namespace cohort::nn
