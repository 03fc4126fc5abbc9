// Model specs as given on the command line (README.md, `--model`; docs/nn.md) and the Model they build.
//
//   mlp:784,512,256,10   Linear(784→512) ReLU Linear(512→256) ReLU Linear(256→10)
//   cnn:lenet            [1, 28, 28] (flat [784] rows are viewed as images): conv 1→6 5x5 pad 2, ReLU,
//                        max-pool 2, conv 6→16 5x5, ReLU, max-pool 2, flatten, fc 400→120, ReLU,
//                        fc 120→84, ReLU, fc 84→10
//   cnn:lenet-bn         the same with BatchNorm2d after each convolution (bn0, bn1)
//   cnn:rosetta          [3, 32, 32]: 2 × (conv 3x3 pad 1 + ReLU, conv 3x3 + ReLU, max-pool 2,
//                        dropout 0.25) with 50 then 100 channels, flatten (3600), fc 512 + ReLU,
//                        dropout 0.5, fc 10
//   gpt:layers=L,heads=H,dim=D,ctx=T[,vocab=V]
//                        nn::Gpt (nn/gpt.h): GPT-2 with L blocks of H heads, width D, context T
//                        tokens, vocabulary V (default 256: bytes, as --data text:FILE); keys in any
//                        order; samples are [T] token ids, outputs [T, V] logits; parameters keep
//                        nanoGPT's names (transformer.wte.weight, ...)
//
// Layers are named by kind, numbered in forward order: fc0.weight, conv1.bias, bn0.running_mean.
//
// The Model (nn/model.h) is named by its spec and built unbound: call params.allocate() (or let
// train::Job place it) and then net->resetParams(). Unknown or malformed specs throw
// InvalidArgument naming the spec and the accepted forms.
#pragma once

#include <memory>
#include <string>

#include "nn/model.h"
#include "nn/sequential.h"

namespace cohort::nn {

// Builds the network (a Sequential) and registers its parameters in model->params (unbound).
std::unique_ptr<Model> buildModel(const std::string& spec);

// Binds `model` (unbound) on `gpu`'s device with the parameter and buffer values of `initialised`
// (a bound CPU model of the same spec, e.g. freshly reset from a seed, so a GPU run starts from the
// numbers a CPU run would), gradients zeroed; returns when the copies are done. CUDA builds only:
// without CUDA it throws InvalidArgument.
void bindOnGpu(Model& model, const Model& initialised, runtime::cuda::GpuContext& gpu);

}  // namespace cohort::nn
