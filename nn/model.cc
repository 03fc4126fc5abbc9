#include "nn/model.h"

#include "runtime/error.h"

namespace cohort::nn {

Model::Model(ModulePtr network, ModelInfo info)
    : name(std::move(info.name)), sampleShape(info.sampleShape), outputs(info.outputs), net(std::move(network)) {
  if (!net) COHORT_THROW(InvalidArgument) << "model '" << name << "' has no network";
  if (name.empty()) COHORT_THROW(InvalidArgument) << "a model needs a name (it identifies it in checkpoints)";
  net->registerParams(params, "");
}

}  // namespace cohort::nn
