// Cohort's public API in one header: the one a program includes to train its own model on its own
// data in one process or many (under cohortrun, mpirun or srun). docs/api.md explains it;
// docs/build.md ("Using Cohort from another build") says how to build against it with Bazel, CMake
// or pkg-config. Installed (scripts/install), it is <cohort/cohort.h> and every header below lives
// under cohort/ too, so nothing clashes with a program's own nn/ or runtime/ folders. The headers
// need C++20. Your first distributed program:
//
//   #include <cohort/cohort.h>
//
//   int main() {
//     return cohort::runMain("my_trainer: ", [] {
//       using namespace cohort;
//       train::Job job({.mode = train::Mode::kAllReduce});  // rank, world, device from the environment
//       auto model = nn::buildModel("mlp:784,256,10");       // or your own: docs/api.md, second program
//       auto optimizer = nn::makeOptimizer({.lr = 0.05f, .momentum = 0.9f}, model->params.numel(), job.gpu());
//       job.place(*model, *optimizer, {.seed = 1});          // collective: parameters where the mode needs them
//       auto data = runtime::data::openDataset("synthetic", runtime::data::Split::kTrain);
//       nn::SoftmaxCrossEntropy loss;
//       train::Trainer trainer(job, loss, *data, nullptr, {.epochs = 2, .batchSize = 64});
//       train::TrainResult r = trainer.run();
//       if (job.world().rank == 0) std::printf("train_loss %.4f\n", r.trainLoss);
//       return 0;
//     });
//   }
//
//   cohortrun --nproc-per-node 4 -- ./my_trainer     # 4 workers, gradients averaged every step
#pragma once

// The job and its loop.
#include "train/job.h"      // train::Job: world, device, parameter placement, step, collectives, checkpoints
#include "train/evaluate.h"  // train::evaluate, loadWeights: a trained model without a job
#include "train/trainer.h"  // train::Trainer: the ready-made loop (epochs, evaluation, callbacks, resume)
#include "train/zero_memory.h"  // train::zeroStateBytes: a rank's model state per ZeRO stage, before allocating

// Networks: the Module contract, compositions, layers.
#include "nn/activation.h"  // nn::Activation, nn::relu(), nn::tanhActivation(), nn::sigmoid()
#include "nn/attention.h"   // nn::CausalSelfAttention: GPT-2's masked multi-head self-attention
#include "nn/batchnorm.h"   // nn::BatchNorm2d
#include "nn/conv2d.h"      // nn::Conv2d
#include "nn/dropout.h"     // nn::Dropout
#include "nn/embedding.h"   // nn::Embedding: token ids -> vectors
#include "nn/gelu.h"        // nn::Gelu (GPT-2's tanh form), nn::gelu()
#include "nn/gpt.h"         // nn::Gpt: GPT-2 (nanoGPT's names and initialisation)
#include "nn/gpt_files.h"   // nn::readHuggingFaceGpt, readLlmcGpt, writeHuggingFaceGpt, writeLlmcGpt: GPT-2 files
#include "nn/gpt_sampler.h"  // nn::GptSampler: text from a Gpt with a cache of keys and values
#include "nn/layer_norm.h"  // nn::LayerNorm
#include "nn/linear.h"      // nn::Linear
#include "nn/model.h"       // nn::Model: a network, its ParamBuffer and a name
#include "nn/model_spec.h"  // nn::buildModel("mlp:784,256,10" | "cnn:lenet" | ...)
#include "nn/model_weights.h"  // nn::readModelWeights, copyWeights, modelOf: weights to start from (--init-from)
#include "nn/module.h"      // nn::Module (the contract your layers implement), nn::Pass
#include "nn/pool.h"        // nn::MaxPool2d, nn::AvgPool2d
#include "nn/precision.h"   // nn::precision::forChild, toFp32: bf16 passes in composites you write
#include "nn/recompute.h"   // nn::Recompute: activation recompute around any module (torch.utils.checkpoint)
#include "nn/reshape.h"     // nn::Flatten, nn::Unflatten
#include "nn/residual.h"    // nn::Residual: y = x + f(x)
#include "nn/sequential.h"  // nn::Sequential: modules in order
#include "nn/softmax.h"     // nn::Softmax, nn::logSoftmax()
#include "nn/tokenizer.h"   // nn::Tokenizer: GPT-2's tokenizer (tiktoken's ids), text <-> token ids
#include "nn/transformer_block.h"  // nn::TransformerBlock: GPT-2's pre-norm residual block

// Training: losses, optimizers, checkpoints, gradient checks.
#include "nn/checkpoint.h"  // nn::writeCheckpoint, readCheckpoint, readSafetensors, writeSafetensors (Job::save/load: whole jobs)
#include "nn/grad_check.h"  // nn::checkGradients: your layer's backward against finite differences
#include "nn/loss.h"        // nn::SoftmaxCrossEntropy, nn::MeanSquaredError, nn::makeLoss
#include "nn/optimizer.h"   // nn::makeOptimizer: SGD, Adam, AdamW over the flat buffers

// Runtime: tensors, errors, logging, the world, random numbers, threads, the version.
#include "runtime/cpu/blas.h"    // runtime::cpu::setBlasThreads: GEMM threads of this process
#include "runtime/error.h"       // cohort::Error and its kinds, COHORT_THROW, COHORT_CHECK, cohort::runMain
#include "runtime/logging.h"     // runtime::Logger: rank-prefixed lines
#include "runtime/random.h"      // runtime::Rng, runtime::mix: counter-based, reproducible
#include "runtime/tensor.h"      // runtime::Tensor, runtime::Shape, runtime::ensureShape
#include "runtime/version.h"     // cohort::version(): this build's "MAJOR.MINOR.PATCH"
#include "runtime/world_info.h"  // runtime::WorldInfo: rank, world size, local rank, job id

// Data.
#include "runtime/data/data_loader.h"  // runtime::data::DataLoader: this rank's shard in batches
#include "runtime/data/dataset.h"      // runtime::data::Dataset, openDataset(spec), datasetFromArrays(...)
#include "runtime/data/tokens.h"       // runtime::data::openTokens, TokenShards: llm.c / nanoGPT token shards
