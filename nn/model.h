// Model: a network (any Module: a built-in Sequential, a user's own composition) together with the
// ParamBuffer its parameters are registered in, and what a training job needs to know about it.
//
// The constructor registers the network's parameters in `params` (prefix ""), unbound; whoever
// trains the model binds them (ParamBuffer::allocate, or train::Job::place, which puts them where
// the job's mode needs them) and initialises them (Module::resetParams). `name` identifies the
// architecture in checkpoints: a checkpoint written for another name is refused on resume.
// Ownership: a Model owns its network and its ParamBuffer, which points into the network's
// modules, so a Model is neither copyable nor movable (hold it by std::unique_ptr or in place).
// Thread safety: as Module (one thread at a time).
//
//   auto net = std::make_unique<Sequential>();
//   net->add(std::make_unique<Linear>(13, 32), "fc0").add(relu(), "relu0").add(std::make_unique<Linear>(32, 1), "fc1");
//   Model model(std::move(net), {.name = "housing-mlp", .sampleShape = Shape{13}, .outputs = 1});
#pragma once

#include <string>

#include "nn/module.h"
#include "nn/param_buffer.h"

namespace cohort::nn {

struct ModelInfo {
  std::string name = "model";  // stored in checkpoints; built-in models use their spec ("mlp:784,512,10")
  Shape sampleShape = {};      // one input sample, e.g. [784] or [3, 32, 32]; [] when not known
  int64_t outputs = 0;         // output features per sample; 0 when not known
};

struct Model {
  Model(ModulePtr network, ModelInfo info);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // The network's output, in fp32 whatever the pass computes in (a bf16 output is converted into a
  // buffer the model owns), so that losses and metrics read fp32; with keepBf16, a bf16 output as it
  // is, for a reader that takes bf16 (a loss whose readsBf16() is true).
  // A bf16 pass on a GPU reads the parameters' bf16 copy (ParamBuffer, "The bf16 copy"): forward
  // refreshes it once at its start unless its owner trusts it; backward's layers read what that
  // forward read.
  const Tensor& forward(const Tensor& input, const Pass& pass, bool keepBf16 = false);
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass);

  std::string name;
  Shape sampleShape;
  int64_t outputs = 0;
  ModulePtr net;
  ParamBuffer params;

 private:
  Tensor outputCast_;
};

}  // namespace cohort::nn
