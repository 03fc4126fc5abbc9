#include "nn/model_spec.h"

#include <charconv>
#include <vector>

#include "nn/activation.h"
#include "nn/linear.h"
#include "runtime/error.h"

namespace cohort::nn {
namespace {

constexpr const char* kAccepted = "accepted: mlp:IN,HIDDEN...,OUT (e.g. mlp:784,512,256,10)";

std::vector<int64_t> parseSizes(const std::string& spec, const std::string& list) {
  std::vector<int64_t> sizes;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    int64_t v = 0;
    auto [end, ec] = std::from_chars(list.data() + pos, list.data() + comma, v);
    if (ec != std::errc() || end != list.data() + comma || v <= 0 || v > (int64_t{1} << 30)) {
      COHORT_THROW(InvalidArgument) << "bad model spec '" << spec << "': '" << list.substr(pos, comma - pos)
                                    << "' is not a positive layer size; " << kAccepted;
    }
    sizes.push_back(v);
    pos = comma + 1;
  }
  return sizes;
}

}  // namespace

std::unique_ptr<Model> buildModel(const std::string& spec) {
  auto model = std::make_unique<Model>();
  model->spec = spec;
  model->net = std::make_unique<Sequential>();
  if (spec.rfind("mlp:", 0) == 0) {
    std::vector<int64_t> sizes = parseSizes(spec, spec.substr(4));
    if (sizes.size() < 2) {
      COHORT_THROW(InvalidArgument) << "bad model spec '" << spec << "': an mlp needs at least an input and an output size; "
                                    << kAccepted;
    }
    for (size_t i = 0; i + 1 < sizes.size(); ++i) {
      model->net->add(std::make_unique<Linear>(sizes[i], sizes[i + 1]), "fc" + std::to_string(i));
      if (i + 2 < sizes.size()) model->net->add(relu(), "relu" + std::to_string(i));
    }
    model->sampleShape = Shape{sizes.front()};
    model->outputs = sizes.back();
  } else {
    COHORT_THROW(InvalidArgument) << "unknown model spec '" << spec << "'; " << kAccepted;
  }
  model->net->registerParams(model->params, "");
  return model;
}

}  // namespace cohort::nn
