#include "cli/memory_estimate.h"

#include <string>

#include "nn/gpt.h"
#include "nn/gpt_memory.h"
#include "nn/model.h"
#include "nn/optimizer.h"
#include "runtime/data/dataset.h"
#include "runtime/device_query.h"
#include "runtime/error.h"
#include "runtime/logging.h"
#include "runtime/process_memory.h"
#include "runtime/world_info.h"

namespace cohort::cli {

namespace {

// The ids the data can hold: a byte per token for text:, a uint16 for tokens:.
int64_t dataVocabulary(const runtime::data::Dataset& d) {
  return d.name().rfind("tokens:", 0) == 0 ? int64_t{65536} : d.numClasses();
}

// The floats of state the optimizer keeps per parameter: momentum for SGD with it, m and v for Adam.
double stateFloatsPerParameter(const nn::OptimizerOptions& o) {
  if (o.kind == nn::OptimizerKind::kSgd) return o.momentum != 0.0f ? 1.0 : 0.0;
  return 2.0;
}

// What a GPT's pass holds at its recompute mode (nn/gpt_memory.h), in floats.
struct Activations {
  double total = 0;      // floats
  double attention = 0;  // of which the T×T scores (CPU)
};

Activations gptActivations(const nn::Model& model, int64_t batch, int64_t context, bool onGpu) {
  const auto* gpt = dynamic_cast<const nn::Gpt*>(model.net.get());
  if (!gpt) return {};
  const nn::GptActivationBytes b =
      nn::gptActivationBytes(gpt->options(), {.batch = batch, .context = context, .onGpu = onGpu});
  return {.total = b.total() / sizeof(float), .attention = b.attention / sizeof(float)};
}

// "--recompute MODE fits (X); " for the first mode after the GPT's own whose floor fits in
// `perWorker`, given the floor without activations; empty when none does or the model is no GPT.
std::string fitHint(const MemoryEstimateInputs& in, double withoutActivations, double perWorker) {
  const auto* gpt = dynamic_cast<const nn::Gpt*>(in.model.net.get());
  if (!gpt) return "";
  nn::GptOptions o = gpt->options();
  for (nn::RecomputeMode mode : {nn::RecomputeMode::kSelective, nn::RecomputeMode::kFull}) {
    if (mode <= o.recompute) continue;
    o.recompute = mode;
    const double floor =
        withoutActivations +
        nn::gptActivationBytes(o, {.batch = in.batchSize, .context = in.context, .onGpu = in.onGpu}).total();
    if (floor <= perWorker) {
      return "--recompute " + nn::recomputeName(mode) + " would fit (" +
             runtime::formatBytes(static_cast<size_t>(floor)) + "); or ";
    }
  }
  return "";
}

}  // namespace

void checkMemoryEstimate(const MemoryEstimateInputs& in, const runtime::WorldInfo& world, const runtime::Logger& log) {
  const double floatBytes = sizeof(float);
  const double state =
      (2.0 + stateFloatsPerParameter(in.optimizer)) * static_cast<double>(in.model.params.numel()) * floatBytes;
  const double vocabulary = in.context > 0 ? static_cast<double>(in.model.outputs) : 0.0;
  const double logits =
      2.0 * static_cast<double>(in.batchSize) * static_cast<double>(in.context) * vocabulary * floatBytes;
  const Activations kept = gptActivations(in.model, in.batchSize, in.context, in.onGpu);
  const double activations = kept.total * floatBytes;
  const double floor = state + logits + activations;
  auto bytes = [](double b) { return runtime::formatBytes(static_cast<size_t>(b)); };
  std::string what =
      "at least " + bytes(floor) + " per worker (parameters, gradients and optimizer state " + bytes(state);
  if (logits > 0) what += ", the logits of a step and their gradient " + bytes(logits);
  if (activations > 0) {
    const auto* gpt = dynamic_cast<const nn::Gpt*>(in.model.net.get());
    what += ", the activations its backward keeps at --recompute " + nn::recomputeName(gpt->options().recompute) + " " +
            bytes(activations);
    if (kept.attention > 0)
      what += " (attention's T×T scores and their gradient " + bytes(kept.attention * floatBytes) + ")";
  }
  what += ")";
  if (in.context > 0 && world.rank == 0 && in.model.outputs > dataVocabulary(in.data)) {
    log.warn() << "model " << in.model.name << " has a vocabulary of " << in.model.outputs << " tokens, but "
               << in.data.name() << " holds ids below " << dataVocabulary(in.data) << ": the other "
               << in.model.outputs - dataVocabulary(in.data)
               << " are never a target, and their weights and logits cost memory and time";
  }
  if (!in.onGpu) {
    const runtime::MemoryHeadroom headroom = runtime::memoryHeadroom();
    const double available = static_cast<double>(headroom.availableBytes);
    const double workers = static_cast<double>(world.localWorldSize > 0 ? world.localWorldSize : 1);
    if (headroom.known() && floor * workers > available) {
      COHORT_THROW(OutOfMemory) << "model " << in.model.name << " at batch " << in.batchSize << " needs " << what
                                << ", more than the " << world.localWorldSize
                                << " worker(s) of this node can have: " << bytes(available) << " available ("
                                << headroom.describe() << "; " << fitHint(in, floor - activations, available / workers)
                                << "lower --batch-size, the context, the model's size or its vocabulary)";
    }
  }
  if (floor >= double(1 << 30) && world.rank == 0) log.info() << "memory: model " << in.model.name << " needs " << what;
}

}  // namespace cohort::cli
