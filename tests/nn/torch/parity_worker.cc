// The Cohort side of tests/nn/torch/parity.py: runs one transformer module forward and backward on
// tensors PyTorch wrote, and writes what it got for the script to compare.
//
//   parity_worker MODULE DIM HEADS DIR [VOCAB LAYERS CONTEXT]
// MODULE is "attention" (CausalSelfAttention), "block" (TransformerBlock) or "gpt" (Gpt, with the
// three sizes after DIR). DIR holds raw little-endian float32 files NAME.f32 and a file `manifest`
// with one line "NAME d0 d1 ..." per tensor: every parameter by the module's own names (prefix
// ""), "input" ([B, T, D]; token ids [B, T] for gpt) and "grad_output" (the output's shape).
// MODULE "gpt-train" (sizes as gpt, then STEPS LR WEIGHT_DECAY) trains the Gpt instead: "input" is
// token ids [STEPS, B, T + 1]; step s takes ids[s, :, :T] as input and ids[s, :, 1:] as targets,
// the mean cross-entropy over the B·T tokens, and one AdamW step (betas 0.9, 0.999, eps 1e-8,
// weight decay on every parameter); it writes "losses" [STEPS] and the parameters after the last
// step as "final.<parameter>". MODULE "gpt-train-nanogpt" is the same with nanoGPT's
// configure_optimizers instead: AdamW with betas 0.9, 0.95 and the weight decay on the >= 2-D
// parameters only (nn::decayMatricesOnly). The worker adds "output", "grad_input" and "grad.<parameter>" for every
// parameter to DIR (and to the manifest). Exit 1 with a line on stderr for anything unexpected.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "nn/attention.h"
#include "nn/gpt.h"
#include "nn/loss.h"
#include "nn/optimizer.h"
#include "nn/transformer_block.h"
#include "runtime/error.h"

namespace {

using cohort::runtime::Shape;
using cohort::runtime::Tensor;

std::map<std::string, Tensor> readDir(const std::string& dir) {
  std::map<std::string, Tensor> tensors;
  std::ifstream manifest(dir + "/manifest");
  if (!manifest) COHORT_THROW(IoError) << "no manifest in " << dir;
  std::string line;
  while (std::getline(manifest, line)) {
    std::istringstream words(line);
    std::string name;
    words >> name;
    Shape shape;
    for (int64_t d; words >> d;) shape.push(d);
    Tensor t = Tensor::zeros(shape);
    std::ifstream in(dir + "/" + name + ".f32", std::ios::binary);
    in.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(t.bytes()));
    if (!in || in.gcount() != static_cast<std::streamsize>(t.bytes())) {
      COHORT_THROW(IoError) << dir << "/" << name << ".f32 does not hold " << shape.str() << " floats";
    }
    tensors.emplace(name, std::move(t));
  }
  return tensors;
}

void write(const std::string& dir, const std::string& name, const Tensor& t) {
  std::ofstream out(dir + "/" + name + ".f32", std::ios::binary);
  out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.bytes()));
  std::ofstream manifest(dir + "/manifest", std::ios::app);
  manifest << name;
  for (int i = 0; i < t.shape().rank(); ++i) manifest << ' ' << t.shape()[i];
  manifest << '\n';
  if (!out || !manifest) COHORT_THROW(IoError) << "cannot write " << dir << "/" << name << ".f32";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc != 5 && argc != 8 && argc != 11) {
      COHORT_THROW(InvalidArgument)
          << "usage: parity_worker attention|block|gpt|gpt-train DIM HEADS DIR [VOCAB LAYERS CONTEXT [STEPS LR WD]]";
    }
    const std::string kind = argv[1], dir = argv[4];
    const cohort::nn::AttentionOptions options{.dim = std::stoll(argv[2]), .heads = std::stoll(argv[3])};
    std::unique_ptr<cohort::nn::Module> module;
    if (kind == "attention") {
      module = std::make_unique<cohort::nn::CausalSelfAttention>(options);
    } else if (kind == "block") {
      module = std::make_unique<cohort::nn::TransformerBlock>(options);
    } else if ((kind == "gpt" && argc == 8) || ((kind == "gpt-train" || kind == "gpt-train-nanogpt") && argc == 11)) {
      module = std::make_unique<cohort::nn::Gpt>(cohort::nn::GptOptions{.vocab = std::stoll(argv[5]),
                                                                        .layers = std::stoll(argv[6]),
                                                                        .heads = options.heads,
                                                                        .dim = options.dim,
                                                                        .context = std::stoll(argv[7])});
    } else {
      COHORT_THROW(InvalidArgument) << "unknown module '" << kind << "'";
    }
    std::map<std::string, Tensor> given = readDir(dir);
    cohort::nn::ParamBuffer params;
    module->registerParams(params, "");
    params.allocate(cohort::runtime::cpuAllocator());
    for (size_t i = 0; i < params.entries().size(); ++i) {
      const auto& e = params.entries()[i];
      auto it = given.find(e.name);
      if (it == given.end()) COHORT_THROW(InvalidArgument) << "PyTorch gave no parameter '" << e.name << "'";
      if (it->second.shape() != e.shape) {
        COHORT_THROW(InvalidArgument) << "parameter '" << e.name << "' is " << it->second.shape().str()
                                              << " in PyTorch and " << e.shape.str() << " here";
      }
      params.value(i).copyFrom(it->second);
    }
    cohort::nn::Pass pass;
    if (kind == "gpt-train" || kind == "gpt-train-nanogpt") {
      const Tensor& ids = given.at("input");
      const int64_t steps = std::stoll(argv[8]), batch = ids.dim(1), time = ids.dim(2) - 1;
      if (ids.rank() != 3 || ids.dim(0) != steps) COHORT_THROW(InvalidArgument) << "ids " << ids.shape().str();
      cohort::nn::OptimizerOptions adamw{.kind = cohort::nn::OptimizerKind::kAdamW,
                                         .lr = std::stof(argv[9]),
                                         .weightDecay = std::stof(argv[10])};
      if (kind == "gpt-train-nanogpt") {
        adamw.beta2 = 0.95f;
        adamw.groups = cohort::nn::decayMatricesOnly(params, adamw.weightDecay);
      }
      auto optimizer = cohort::nn::makeOptimizer(adamw, static_cast<size_t>(params.numel()));
      cohort::nn::SoftmaxCrossEntropy loss;
      Tensor losses = Tensor::zeros(Shape{steps});
      Tensor x = Tensor::zeros(Shape{batch, time}), y = Tensor::zeros(Shape{batch * time});
      for (int64_t s = 0; s < steps; ++s) {
        for (int64_t b = 0; b < batch; ++b) {
          for (int64_t t = 0; t < time; ++t) {
            x.at(b * time + t) = ids.at((s * batch + b) * (time + 1) + t);
            y.at(b * time + t) = ids.at((s * batch + b) * (time + 1) + t + 1);
          }
        }
        const Tensor& logits = module->forward(x, pass);
        losses.at(s) = loss.forward(logits.reshape(Shape{batch * time, logits.dim(2)}), y);
        module->backward(loss.backward().reshape(logits.shape()), pass);
        optimizer->step(params.values(), params.grads());
      }
      write(dir, "losses", losses);
      for (size_t i = 0; i < params.entries().size(); ++i) {
        write(dir, "final." + params.entries()[i].name, params.value(i));
      }
      return 0;
    }
    write(dir, "output", module->forward(given.at("input"), pass));
    write(dir, "grad_input", module->backward(given.at("grad_output"), pass));
    for (size_t i = 0; i < params.entries().size(); ++i) {
      write(dir, "grad." + params.entries()[i].name, params.grad(i));
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "parity_worker: " << e.what() << "\n";
    return 1;
  }
}
