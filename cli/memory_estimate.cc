#include "cli/memory_estimate.h"

#include <string>

#include "nn/model.h"
#include "nn/optimizer.h"
#include "runtime/data/dataset.h"
#include "runtime/device_query.h"
#include "runtime/error.h"
#include "runtime/logging.h"
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

}  // namespace

void checkMemoryEstimate(const MemoryEstimateInputs& in, const runtime::WorldInfo& world, const runtime::Logger& log) {
  const double floatBytes = sizeof(float);
  const double state = (2.0 + stateFloatsPerParameter(in.optimizer)) * static_cast<double>(in.model.params.numel()) * floatBytes;
  const double vocabulary = in.context > 0 ? static_cast<double>(in.model.outputs) : 0.0;
  const double logits = 2.0 * static_cast<double>(in.batchSize) * static_cast<double>(in.context) * vocabulary * floatBytes;
  const double floor = state + logits;
  auto bytes = [](double b) { return runtime::formatBytes(static_cast<size_t>(b)); };
  const std::string what = "at least " + bytes(floor) + " per worker (parameters, gradients and optimizer state " +
                           bytes(state) + (logits > 0 ? ", the logits of a step and their gradient " + bytes(logits) : "") + ")";
  if (in.context > 0 && world.rank == 0 && in.model.outputs > dataVocabulary(in.data)) {
    log.warn() << "model " << in.model.name << " has a vocabulary of " << in.model.outputs << " tokens, but " << in.data.name()
               << " holds ids below " << dataVocabulary(in.data) << ": the other " << in.model.outputs - dataVocabulary(in.data)
               << " are never a target, and their weights and logits cost memory and time";
  }
  if (!in.onGpu) {
    const double available = static_cast<double>(runtime::hostInfo().availableMemoryBytes);
    const double workers = static_cast<double>(world.localWorldSize > 0 ? world.localWorldSize : 1);
    if (available > 0 && floor * workers > available) {
      COHORT_THROW(OutOfMemory) << "model " << in.model.name << " at batch " << in.batchSize << " needs " << what << ", more than the "
                                << world.localWorldSize << " worker(s) of this node can have: " << bytes(available)
                                << " available (lower --batch-size, the model's size or its vocabulary)";
    }
  }
  if (floor >= double(1 << 30) && world.rank == 0) log.info() << "memory: model " << in.model.name << " needs " << what;
}

}  // namespace cohort::cli
