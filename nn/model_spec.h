// Model specs as given on the command line (DESIGN.md §4) and the Model they build.
//
//   mlp:784,512,256,10   Linear(784→512) ReLU Linear(512→256) ReLU Linear(256→10)
//
// A Model owns its network and the ParamBuffer its parameters live in. It is built unbound: call
// params.allocate()/attach() and then net->resetParams(). Unknown or malformed specs throw
// InvalidArgument naming the spec and the accepted forms. Not copyable or movable once bound
// (the buffer points into the modules).
#pragma once

#include <memory>
#include <string>

#include "nn/param_buffer.h"
#include "nn/sequential.h"

namespace cohort::nn {

struct Model {
  std::string spec;
  Shape sampleShape;  // one input sample, e.g. [784]
  int64_t outputs = 0;
  std::unique_ptr<Sequential> net;
  ParamBuffer params;
};

// Builds the network and registers its parameters in model->params (unbound).
std::unique_ptr<Model> buildModel(const std::string& spec);

}  // namespace cohort::nn
