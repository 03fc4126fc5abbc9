#include "train/evaluate.h"

#include <algorithm>
#include <bit>
#include <vector>

#include "collectives/communicator.h"  // sumOverRanks
#include "nn/gpt.h"
#include "nn/model_spec.h"
#include "runtime/error.h"

namespace cohort::train {

using runtime::Tensor;

Evaluation evaluate(nn::Model& model, nn::Loss& loss, const runtime::data::Dataset& data, int64_t batchSize) {
  const int64_t chunks = chunkCount(data.size(), batchSize);
  std::vector<double> sums(2 * static_cast<size_t>(chunks), 0.0);
  evaluateChunks(model, loss, data, batchSize, 0, chunks, sums);
  return evaluationOf(sums, data.size(), loss.positions());
}

int64_t chunkCount(int64_t samples, int64_t batchSize) {
  COHORT_CHECK(batchSize > 0) << "evaluation chunks of " << batchSize;
  return (samples + batchSize - 1) / batchSize;
}

void evaluateChunks(nn::Model& model, nn::Loss& loss, const runtime::data::Dataset& data, int64_t batchSize,
                    int64_t first, int64_t last, std::span<double> sums) {
  nn::Pass pass;
  pass.training = false;
  pass.needInputGrad = false;
  const int64_t n = data.size();
  for (int64_t c = first; c < last; ++c) {
    const int64_t begin = c * batchSize, count = std::min(batchSize, n - begin);
    const runtime::data::Dataset::Rows rows = data.rows(begin, count);
    const Tensor& out = model.forward(rows.inputs, pass);
    sums[static_cast<size_t>(2 * c)] = static_cast<double>(loss.forward(out, rows.targets)) * static_cast<double>(count);
    sums[static_cast<size_t>(2 * c + 1)] = static_cast<double>(loss.correct());
  }
}

Evaluation evaluationOf(std::span<const double> sums, int64_t samples, int64_t positions) {
  double lossSum = 0, correct = 0;
  for (size_t i = 0; i < sums.size(); i += 2) {
    lossSum += sums[i];
    correct += sums[i + 1];
  }
  return {samples ? lossSum / static_cast<double>(samples) : 0,
          samples ? correct / static_cast<double>(samples * positions) : 0};
}

void splitSums(std::span<const double> sums, std::span<double> pieces) {
  COHORT_CHECK(pieces.size() == kPiecesPerSum * sums.size())
      << pieces.size() << " pieces for " << sums.size() << " sums";
  for (size_t i = 0; i < sums.size(); ++i) {
    const auto bits = std::bit_cast<uint64_t>(sums[i]);
    for (size_t k = 0; k < kPiecesPerSum; ++k)
      pieces[kPiecesPerSum * i + k] = static_cast<double>((bits >> (16 * k)) & 0xffff);
  }
}

void joinSums(std::span<const double> pieces, std::span<double> sums) {
  COHORT_CHECK(pieces.size() == kPiecesPerSum * sums.size())
      << pieces.size() << " pieces for " << sums.size() << " sums";
  for (size_t i = 0; i < sums.size(); ++i) {
    uint64_t bits = 0;
    for (size_t k = 0; k < kPiecesPerSum; ++k) bits |= static_cast<uint64_t>(pieces[kPiecesPerSum * i + k]) << (16 * k);
    sums[i] = std::bit_cast<double>(bits);
  }
}

int64_t evaluationChunk(const nn::Model& model, int64_t requested) {
  const int64_t positions = datasetHints(model, 0).context;
  const int64_t bytesPerSample = std::max<int64_t>(1, positions) * std::max<int64_t>(1, model.outputs) *
                                 static_cast<int64_t>(sizeof(float));
  int64_t chunk = std::min(requested, kEvaluationLogitBytes / bytesPerSample);
  if (positions > 0) chunk = std::min(chunk, kEvaluationPositions / positions);
  return std::max<int64_t>(1, chunk);
}

std::unique_ptr<nn::Model> loadModel(const nn::Checkpoint& checkpoint, const std::string& path) {
  auto spec = checkpoint.metadata.find("model");
  if (spec == checkpoint.metadata.end()) COHORT_THROW(IoError) << path << ": checkpoint metadata lacks 'model'";
  std::unique_ptr<nn::Model> model = nn::buildModel(spec->second);
  model->params.allocate(runtime::cpuAllocator());
  loadWeights(*model, checkpoint, path);
  return model;
}

runtime::data::DatasetHints datasetHints(const nn::Model& model, uint64_t seed) {
  const bool languageModel = model.name.rfind("gpt:", 0) == 0;
  // A padded vocabulary's extra ids are no tokens (their logits are −inf): the data's ids stay below
  // the real vocabulary.
  const auto* gpt = dynamic_cast<const nn::Gpt*>(model.net.get());
  return {.context = languageModel ? model.sampleShape.numel() : 0,
          .seed = seed,
          .vocabulary = languageModel ? (gpt ? gpt->options().predictedVocab() : model.outputs) : 0};
}

void loadWeights(nn::Model& model, const nn::Checkpoint& checkpoint, const std::string& path) {
  auto copy = [&](const nn::ParamBuffer::Entry& e, const Tensor& into) {
    const Tensor* t = checkpoint.find(e.name);
    if (!t) COHORT_THROW(InvalidArgument) << path << ": checkpoint of another model: it has no tensor '" << e.name << "'";
    if (t->shape() != e.shape) {
      COHORT_THROW(InvalidArgument) << path << ": checkpoint of another model: '" << e.name << "' is " << t->shape().str()
                                    << " there and " << e.shape.str() << " here";
    }
    into.copyFrom(*t);
  };
  const nn::ParamBuffer& params = model.params;
  for (size_t i = 0; i < params.entries().size(); ++i) copy(params.entries()[i], params.value(i));
  for (size_t i = 0; i < params.bufferEntries().size(); ++i) copy(params.bufferEntries()[i], params.buffer(i));
}

namespace {
constexpr int kCountPieces = 3;  // sumOverRanks: 16 bits each
constexpr int kCountPieceBits = 16;
}  // namespace

std::vector<int64_t> sumOverRanks(std::span<const int64_t> counts, const runtime::WorldInfo& world,
                                  std::chrono::milliseconds timeout) {
  std::vector<int64_t> sums(counts.begin(), counts.end());
  if (world.isSingle()) return sums;
  if (world.worldSize >= 256) {
    COHORT_THROW(InvalidArgument) << "sumOverRanks: " << world.worldSize << " ranks, at most 255 sum exactly";
  }
  std::vector<float> pieces(counts.size() * kCountPieces);
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < 0 || counts[i] >= (int64_t{1} << (kCountPieces * kCountPieceBits - 1))) {
      COHORT_THROW(InvalidArgument) << "sumOverRanks: count " << counts[i] << " is outside 0..2^47";
    }
    for (int k = 0; k < kCountPieces; ++k) {
      pieces[i * kCountPieces + k] = static_cast<float>((counts[i] >> (k * kCountPieceBits)) & 0xFFFF);
    }
  }
  auto comm = collectives::makeCommunicator({.backend = "", .world = world, .timeout = timeout});
  comm->allReduce(pieces.data(), pieces.data(), pieces.size(), {})->wait(timeout);
  for (size_t i = 0; i < counts.size(); ++i) {
    sums[i] = 0;
    for (int k = 0; k < kCountPieces; ++k) sums[i] += static_cast<int64_t>(pieces[i * kCountPieces + k]) << (k * kCountPieceBits);
  }
  return sums;
}

}  // namespace cohort::train
