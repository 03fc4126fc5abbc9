// The Cohort side of tests/nn/torch/gpt2_weights.py: reads GPT-2 weights through nn::readModelWeights
// (the path `cohort train --init-from` and `cohort generate` take) and runs the model on token ids.
//
//   gpt2_weights_worker logits WEIGHTS TOKENS OUT [SPEC]
//     TOKENS: raw int32 [B, T] preceded by two int32 B and T; OUT gets the logits, raw float32
//     [B, T, V]. SPEC (a gpt: model spec) is the model to build, else the one the weights name.
//   gpt2_weights_worker checkpoint WEIGHTS OUT
//     writes the weights as a Cohort checkpoint of the model they name (what training would save).
// Prints one line "model SPEC format FORMAT" to stdout. Exit 1 with a line on stderr for anything
// unexpected.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/model_spec.h"
#include "nn/model_weights.h"
#include "runtime/error.h"

namespace {

using cohort::runtime::Shape;
using cohort::runtime::Tensor;
namespace nn = cohort::nn;

Tensor readTokens(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  int32_t dims[2] = {};
  in.read(reinterpret_cast<char*>(dims), sizeof dims);
  std::vector<int32_t> ids(static_cast<size_t>(dims[0]) * static_cast<size_t>(dims[1]));
  in.read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(ids.size() * sizeof(int32_t)));
  if (!in || dims[0] < 1 || dims[1] < 1) COHORT_THROW(IoError) << path << ": not [B, T] int32 token ids";
  Tensor t = Tensor::zeros(Shape{dims[0], dims[1]});
  for (size_t i = 0; i < ids.size(); ++i) t.at(static_cast<int64_t>(i)) = static_cast<float>(ids[i]);
  return t;
}

int logits(const std::string& weightsPath, const std::string& tokens, const std::string& out, const std::string& spec) {
  const nn::ModelWeights weights = nn::readModelWeights(weightsPath);
  std::unique_ptr<nn::Model> model;
  if (spec.empty()) {
    model = nn::modelOf(weights);
  } else {
    model = nn::buildModel(spec);
    model->params.allocate(cohort::runtime::cpuAllocator());
    nn::copyWeights(*model, weights);
  }
  std::printf("model %s format %s\n", model->name.c_str(), weights.format.c_str());
  const Tensor ids = readTokens(tokens);
  const Tensor& y = model->forward(ids, nn::Pass{.training = false});
  std::ofstream file(out, std::ios::binary);
  file.write(reinterpret_cast<const char*>(y.data()), static_cast<std::streamsize>(y.bytes()));
  if (!file) COHORT_THROW(IoError) << out << ": cannot write";
  return 0;
}

int checkpoint(const std::string& weightsPath, const std::string& out) {
  const nn::ModelWeights weights = nn::readModelWeights(weightsPath);
  const std::unique_ptr<nn::Model> model = nn::modelOf(weights);
  std::printf("model %s format %s\n", model->name.c_str(), weights.format.c_str());
  std::vector<nn::NamedTensor> tensors;
  for (size_t i = 0; i < model->params.entries().size(); ++i) {
    tensors.push_back({model->params.entries()[i].name, model->params.value(i)});
  }
  nn::writeCheckpoint(out, tensors, {{"model", model->name}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "logits" && (argc == 5 || argc == 6)) return logits(argv[2], argv[3], argv[4], argc == 6 ? argv[5] : "");
    if (mode == "checkpoint" && argc == 4) return checkpoint(argv[2], argv[3]);
    std::fprintf(stderr, "usage: gpt2_weights_worker logits WEIGHTS TOKENS OUT [SPEC] | checkpoint WEIGHTS OUT\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt2_weights_worker: %s\n", e.what());
  }
  return 1;
}
