#include "nn/model.h"

#include "nn/precision.h"
#include "runtime/error.h"

namespace cohort::nn {

Model::Model(ModulePtr network, ModelInfo info)
    : name(std::move(info.name)), sampleShape(info.sampleShape), outputs(info.outputs), net(std::move(network)) {
  if (!net) COHORT_THROW(InvalidArgument) << "model '" << name << "' has no network";
  if (name.empty()) COHORT_THROW(InvalidArgument) << "a model needs a name (it identifies it in checkpoints)";
  net->registerParams(params, "");
}

const Tensor& Model::forward(const Tensor& input, const Pass& pass, bool keepBf16) {
  const Tensor& out = net->forward(input, pass);
  return keepBf16 ? out : precision::toFp32(out, outputCast_, pass, *net);
}

}  // namespace cohort::nn
