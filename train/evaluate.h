// Evaluation of a trained model, and its weights from a checkpoint, without a job: what `cohort
// eval` and `cohort predict` (and the Trainer's evaluation on the CPU) are made of.
//
// evaluate() runs the model in evaluation mode (no dropout, BatchNorm on its running statistics) on
// `data` in chunks of `batchSize` rows, on the CPU, and returns the mean loss and the accuracy with
// the same sums in the same order as the Trainer's end-of-epoch evaluation, so the figures are
// bit-identical to what a training run printed for that data.
// loadWeights() copies every parameter and buffer of `model` (bound on the CPU) from a checkpoint
// written by train::Job::save: InvalidArgument naming the parameter when the checkpoint is of
// another model, IoError for an unreadable file.
// Thread safety: one thread per model.
//
//   auto model = nn::buildModel(spec);
//   model->params.allocate(runtime::cpuAllocator());
//   train::loadWeights(*model, checkpoint, path);
//   train::Evaluation e = train::evaluate(*model, *loss, *testSet);
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/loss.h"
#include "nn/model.h"
#include "runtime/data/dataset.h"
#include "runtime/world_info.h"

namespace cohort::train {

struct Evaluation {
  double loss = 0;
  double accuracy = 0;
};

Evaluation evaluate(nn::Model& model, nn::Loss& loss, const runtime::data::Dataset& data, int64_t batchSize = 1000);

// The pieces evaluate() is made of, for an evaluation split over ranks (the Trainer's): chunk c of
// `batchSize` samples (the last one shorter) adds its loss summed over its samples (the batch mean
// times its size) at sums[2c] and its correct predictions at sums[2c + 1]; evaluateChunks computes
// chunks [first, last) on the CPU; evaluationOf adds the chunks' sums in chunk order. Summed over
// ranks that each filled their own chunks (the rest 0), the sums are exact, so the figures are
// evaluate()'s bit for bit.
int64_t chunkCount(int64_t samples, int64_t batchSize);
void evaluateChunks(nn::Model& model, nn::Loss& loss, const runtime::data::Dataset& data, int64_t batchSize,
                    int64_t first, int64_t last, std::span<double> sums);
Evaluation evaluationOf(std::span<const double> sums, int64_t samples, int64_t positions);

// The chunks' sums as whole numbers below 2^16, kPiecesPerSum to a sum (its bits, 16 at a time), so
// that they cross Job::reduce(kSum) exactly where one rank holds each sum and the others send 0:
// ReplicaPlacement reduces through float32, which holds such numbers exactly. splitSums writes
// pieces[kPiecesPerSum * i + k] for sums[i]; joinSums is its inverse, bit for bit (NaN, infinity,
// -0 and subnormals included). Not floats that add up to each sum: GCC 12.2 drops the rounding of
// (double)(float)x in such a loop (docs/build.md, "Floating point and GCC 12").
inline constexpr size_t kPiecesPerSum = 4;
void splitSums(std::span<const double> sums, std::span<double> pieces);
void joinSums(std::span<const double> pieces, std::span<double> sums);

// Whole-number counts summed over the ranks of a program that has no Job, exactly (`cohort eval
// --task`: each rank scores a share of the items). Collective: every rank of `world` calls it once,
// in the same order as its other collectives, with as many counts; it makes its own communicator
// (collectives::makeCommunicator's default backend for the world) for the one all-reduce. A world of
// one returns the counts as given. Each count must lie in 0..2^47 and the world hold fewer than 256
// ranks (InvalidArgument otherwise): a count crosses the float32 all-reduce as three 16-bit pieces,
// whose sums are then exact. TimeoutError when a peer does not arrive within `timeout`, PeerError
// when one is gone.
std::vector<int64_t> sumOverRanks(std::span<const int64_t> counts, const runtime::WorldInfo& world,
                                  std::chrono::milliseconds timeout);

// The samples per forward pass of an evaluation that asks for `requested`: that many, but no more
// than kEvaluationLogitBytes of outputs (the model's outputs per sample, times T positions for a
// language model, in fp32), and for a language model (a gpt: spec) no more than
// kEvaluationPositions / T; at least one. The logits and the loss's probabilities of the same size
// dominate a large vocabulary's evaluation: 4096 positions of GPT-2's 50257 logits are 823 MB
// (a 3.3M-parameter model peaked at 1.6 GiB evaluating), 64 MiB of them 5 windows of 64; the
// positions bound the activations of a small vocabulary (1000 windows of 64 bytes would hold some
// 2.6 GB for a 4 x 128 GPT where 64 hold 170 MB). The Trainer, `cohort eval` and `predict` all chunk
// so, and so print the same bits.
inline constexpr int64_t kEvaluationPositions = 4096;
inline constexpr int64_t kEvaluationLogitBytes = int64_t{64} << 20;
int64_t evaluationChunk(const nn::Model& model, int64_t requested);

void loadWeights(nn::Model& model, const nn::Checkpoint& checkpoint, const std::string& path);

// The model a checkpoint was written for (nn::buildModel of its "model" metadata), bound on the CPU
// with the checkpoint's weights: what `cohort eval`, `predict` and `generate` start from. IoError when
// the metadata names no model; otherwise throws as buildModel and loadWeights.
std::unique_ptr<nn::Model> loadModel(const nn::Checkpoint& checkpoint, const std::string& path);

// What opening a dataset for `model` needs: a built-in language model's context (gpt: specs), so
// that text:FILE cuts windows of that many tokens, and the seed that places the train windows.
runtime::data::DatasetHints datasetHints(const nn::Model& model, uint64_t seed);

}  // namespace cohort::train
