#include "cli/memory_estimate.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/gpt_memory.h"
#include "nn/model.h"
#include "nn/optimizer.h"
#include "runtime/data/dataset.h"
#include "runtime/device_query.h"
#include "runtime/error.h"
#include "runtime/gpu_scratch.h"
#include "runtime/logging.h"
#include "runtime/process_memory.h"
#include "runtime/world_info.h"
#include "train/zero_memory.h"

namespace cohort::cli {

namespace {

// The ids the data can hold: a byte per token for text:, a uint16 for tokens:.
int64_t dataVocabulary(const runtime::data::Dataset& d) {
  return d.name().rfind("tokens:", 0) == 0 ? int64_t{65536} : d.numClasses();
}

std::string bytes(double b) { return runtime::formatBytes(static_cast<size_t>(b)); }

constexpr char kLowerTheRest[] = "lower --batch-size, the context, the model's size or its vocabulary";

const nn::Gpt* gptOf(const nn::Model& model) { return dynamic_cast<const nn::Gpt*>(model.net.get()); }

// One rank's floor at one --zero stage and --recompute mode, in bytes.
struct Floor {
  int zero = 0;
  std::optional<nn::RecomputeMode> recompute;  // a GPT's
  train::StateBytes state;
  double logits = 0;       // a language model's logits of a step and their gradient
  double activations = 0;  // what a GPT's pass keeps (nn/gpt_memory.h)
  double attention = 0;    // of which the CPU attention's T×T scores
  double placement = 0;    // the most held while the job places the model (train/zero_memory.h)
  // On a GPU, device scratch beside the tensors (runtime/gpu_scratch.h): the bf16 attention backward's
  // dS (one block for all layers: the largest layer's) and cuBLASLt's workspace.
  double attentionScratch = 0;
  double blasWorkspace = 0;
  // On a GPU in bf16: the parameters' bf16 copy the layers read (nn/param_buffer.h), 2 bytes per
  // element of the whole flat buffer at every --zero stage.
  double halfCopy = 0;
  double workspaces() const { return attentionScratch + blasWorkspace; }
  double total() const {
    return std::max(static_cast<double>(state.total()) + halfCopy + logits + activations + workspaces(), placement);
  }
};

// The GPU's scratch beside the tensors: a GPT's bf16 attention backward borrows its dS from the
// context's workspace (every block has the same shape, so the block is one layer's); every model
// `cohort train` builds has a Linear (its head, at least), so its products take cuBLASLt's
// workspace, whose size depends on the device's compute capability (the smaller when the runtime
// cannot say). The step guard's few KiB of sums (train/step) are not counted.
void countGpuWorkspaces(const MemoryEstimateInputs& in, Floor& f) {
  if (!in.onGpu) return;
  const std::optional<runtime::CudaMemory> device = runtime::cudaMemory(in.device);
  f.blasWorkspace = static_cast<double>(runtime::cublasLtWorkspaceBytes(device ? device->computeCapabilityMajor : 0));
  const nn::Gpt* gpt = gptOf(in.model);
  if (!gpt || in.precision != runtime::DType::kBF16) return;  // the fp32 kernels keep no dS
  const nn::GptOptions& o = gpt->options();
  f.attentionScratch = static_cast<double>(runtime::bf16AttentionScratchBytes(
      {.batch = in.batchSize, .heads = o.heads, .time = in.context, .headSize = o.dim / o.heads}));
}

// A bf16 pass on a GPU reads the parameters its layers declare (Linear's, a GPT head's) from one bf16
// copy of the whole flat buffer (ParamBuffer::halfValue), whatever the stage: 2 bytes per element.
void countHalfCopy(const MemoryEstimateInputs& in, Floor& f) {
  if (!in.onGpu || in.precision != runtime::DType::kBF16 || !in.model.params.readsAnyAsBf16()) return;
  f.halfCopy = 2.0 * static_cast<double>(in.model.params.numel());
}

// Whether the loss writes the logits' gradient over them: on a GPU, for a model whose backward does
// not read its output (a GPT; the Trainer's Loss::setGradInPlace).
bool gradientOverLogits(const MemoryEstimateInputs& in) { return in.onGpu && !in.model.net->backwardReadsOutput(); }

const char* logitsWhat(const MemoryEstimateInputs& in) {
  return gradientOverLogits(in) ? "the logits of a step (their gradient written over them)"
                                : "the logits of a step and their gradient";
}

Floor floorAt(const MemoryEstimateInputs& in, int zero, std::optional<nn::RecomputeMode> recompute) {
  std::vector<size_t> units;
  for (const auto& u : in.model.params.units()) units.push_back(u.numel);
  Floor f{.zero = zero, .recompute = recompute};
  const bool bf16 = in.precision == runtime::DType::kBF16 && zero > 0;
  const train::ZeroMemoryOptions zeroOptions{
      .units = units,
      .stage = zero,
      .groupSize = in.shardGroup,
      .optimizer = in.optimizer,
      .precision = in.precision,
      // bf16 on GPUs: the gathers' message buffers (train/zero_memory.h).
      .gatherWords = bf16 ? train::bf16GatherWords(in.model.params, in.shardGroup) : std::vector<size_t>{},
      .onGpu = in.onGpu};
  f.state = train::zeroStateBytes(zeroOptions);
  f.placement = static_cast<double>(train::zeroPlacementPeakBytes(zeroOptions));
  const double vocabulary = in.context > 0 ? static_cast<double>(in.model.outputs) : 0.0;
  // On a GPU a GPT's loss writes the gradient over its logits (Loss::setGradInPlace), bf16 in a bf16 pass.
  const double element = in.onGpu && in.precision == runtime::DType::kBF16 ? 2.0 : 4.0;
  f.logits = (gradientOverLogits(in) ? 1.0 : 2.0) * static_cast<double>(in.batchSize) *
             static_cast<double>(in.context) * vocabulary * element;
  if (const nn::Gpt* gpt = gptOf(in.model)) {
    nn::GptOptions o = gpt->options();
    o.recompute = *recompute;
    const nn::GptActivationBytes b =
        nn::gptActivationBytes(o, {.batch = in.batchSize, .context = in.context, .onGpu = in.onGpu});
    f.activations = b.total();
    f.attention = b.attention;
  }
  countGpuWorkspaces(in, f);
  countHalfCopy(in, f);
  return f;
}

Floor floorOfTheRun(const MemoryEstimateInputs& in) {
  std::optional<nn::RecomputeMode> recompute;
  if (const nn::Gpt* gpt = gptOf(in.model)) recompute = gpt->options().recompute;
  return floorAt(in, in.zero, recompute);
}

// "--zero 2 --recompute full": the flags of `f` that differ from `run`'s.
std::string changedFlags(const MemoryEstimateInputs& in, const Floor& f, const Floor& run) {
  std::string flags;
  if (f.zero != run.zero) {
    flags = "--zero ";
    flags += std::to_string(f.zero);
  }
  if (f.recompute != run.recompute) {
    flags += (flags.empty() ? "" : " ") + std::string("--recompute ") + nn::recomputeName(*f.recompute);
  }
  return flags;
}

// The changes of --zero and --recompute to try, smallest first (the header's order).
std::vector<Floor> changes(const MemoryEstimateInputs& in, const Floor& run) {
  std::vector<int> stages;
  if (in.zeroRuns) {
    for (int z = run.zero + 1; z <= train::kMaxZeroStage; ++z) stages.push_back(z);
  }
  std::vector<nn::RecomputeMode> modes;
  for (nn::RecomputeMode m : {nn::RecomputeMode::kSelective, nn::RecomputeMode::kFull}) {
    if (run.recompute && m > *run.recompute) modes.push_back(m);
  }
  std::vector<Floor> tried;
  for (int z : stages) tried.push_back(floorAt(in, z, run.recompute));
  for (nn::RecomputeMode m : modes) tried.push_back(floorAt(in, run.zero, m));
  for (int z : stages) {
    for (nn::RecomputeMode m : modes) tried.push_back(floorAt(in, z, m));
  }
  return tried;
}

// "--zero 2 would fit (X per worker); or " for the smallest change whose floor fits in `perWorker`;
// empty when nothing fits.
std::string fitHint(const MemoryEstimateInputs& in, const Floor& run, double perWorker) {
  for (const Floor& f : changes(in, run)) {
    if (f.total() <= perWorker) return changedFlags(in, f, run) + " would fit (" + bytes(f.total()) + " per worker); or ";
  }
  return "";
}

// "GPU workspaces X (the attention backward's dS scratch Y, cuBLASLt's workspace Z)".
std::string workspacesWhat(const Floor& f) {
  std::string what = "GPU workspaces " + bytes(f.workspaces()) + " (";
  if (f.attentionScratch > 0) what += "the attention backward's dS scratch " + bytes(f.attentionScratch) + ", ";
  return what + "cuBLASLt's workspace " + bytes(f.blasWorkspace) + ")";
}

// "at least X per worker (parameters, gradients and optimizer state Y, …)": what the floor counts.
std::string describeFloor(const MemoryEstimateInputs& in, const Floor& f) {
  const train::StateBytes& s = f.state;
  std::string what = "at least " + bytes(f.total()) + " per worker (parameters, gradients and optimizer state " +
                     bytes(static_cast<double>(s.params + s.grads + s.optimizer));
  if (in.zero > 0)
    what += " at --zero " + std::to_string(in.zero) + " over " + std::to_string(in.shardGroup) + " ranks";
  if (s.staging > 0) what += ", the shards' temporary buffers " + bytes(static_cast<double>(s.staging));
  if (f.halfCopy > 0) what += ", the parameters' bf16 copy " + bytes(f.halfCopy);
  if (f.logits > 0) what += std::string(", ") + logitsWhat(in) + " " + bytes(f.logits);
  if (f.placement > static_cast<double>(s.total()) + f.halfCopy + f.logits + f.activations + f.workspaces()) {
    what += "; while the job places the model " + bytes(f.placement) +
            (in.onGpu ? " (the whole parameters and gradients before they are sharded)"
                      : " (the whole parameters before they are sharded)");
  }
  if (f.activations > 0) {
    what += ", the activations its backward keeps at --recompute " + nn::recomputeName(*f.recompute) + " " +
            bytes(f.activations);
    if (f.attention > 0) what += " (attention's T×T scores and their gradient " + bytes(f.attention) + ")";
  }
  if (f.workspaces() > 0) what += ", " + workspacesWhat(f);
  return what + ")";
}

// --memory-report, before anything is allocated: the floor by kind, per rank.
void reportEstimate(const MemoryEstimateInputs& in, const Floor& f, const runtime::Logger& log) {
  auto line = log.info();
  line << "memory estimate per rank (--zero " << in.zero << " over " << in.shardGroup << " rank(s)";
  if (f.recompute) line << ", --recompute " << nn::recomputeName(*f.recompute);
  line << "): parameters " << bytes(static_cast<double>(f.state.params));
  if (f.halfCopy > 0) line << " (and their bf16 copy " << bytes(f.halfCopy) << ")";
  line << ", gradients " << bytes(static_cast<double>(f.state.grads)) << ", optimizer state "
       << bytes(static_cast<double>(f.state.optimizer)) << ", temporary buffers "
       << bytes(static_cast<double>(f.state.staging)) << ", activations " << bytes(f.activations + f.logits);
  if (f.logits > 0) {
    line << (gradientOverLogits(in) ? " (logits, their gradient written over them, " : " (logits and their gradient ")
         << bytes(f.logits) << ")";
  }
  if (f.workspaces() > 0) line << ", " << workspacesWhat(f);
  line << "; " << bytes(f.total()) << " in all";
}

void warnVocabulary(const MemoryEstimateInputs& in, const runtime::Logger& log) {
  if (in.context <= 0 || in.model.outputs <= dataVocabulary(in.data)) return;
  log.warn() << "model " << in.model.name << " has a vocabulary of " << in.model.outputs << " tokens, but "
             << in.data.name() << " holds ids below " << dataVocabulary(in.data) << ": the other "
             << in.model.outputs - dataVocabulary(in.data)
             << " are never a target, and their weights and logits cost memory and time";
}

// The CPU: the floor of every local worker against what the node's workers can have.
void checkHost(const MemoryEstimateInputs& in, const Floor& run, const std::string& what,
               const runtime::WorldInfo& world) {
  runtime::MemoryHeadroom headroom = runtime::memoryHeadroom();
  std::string limit = headroom.describe();
  if (in.testAvailableBytes > 0) {
    headroom = {.availableBytes = in.testAvailableBytes, .hostAvailableBytes = in.testAvailableBytes};
    limit = "COHORT_TEST_MEMORY_AVAILABLE";
  }
  const double available = static_cast<double>(headroom.availableBytes);
  const double workers = static_cast<double>(world.localWorldSize > 0 ? world.localWorldSize : 1);
  if (headroom.known() && run.total() * workers > available) {
    COHORT_THROW(OutOfMemory) << "model " << in.model.name << " at batch " << in.batchSize << " needs " << what
                              << ", more than the " << world.localWorldSize
                              << " worker(s) of this node can have: " << bytes(available) << " available (" << limit
                              << "; " << fitHint(in, run, available / workers) << kLowerTheRest << ")";
  }
}

// A GPU: this worker's floor against what its device has free now (its context made, nothing of the
// model allocated yet).
void checkGpu(const MemoryEstimateInputs& in, const Floor& run, const std::string& what) {
  const std::optional<runtime::CudaMemory> memory = runtime::cudaMemory(in.device);
  if (!memory) return;
  const double available = static_cast<double>(memory->freeBytes);
  if (run.total() <= available) return;
  COHORT_THROW(OutOfMemory) << "model " << in.model.name << " at batch " << in.batchSize << " needs " << what
                            << ", more than cuda:" << in.device << " (" << memory->name << ") has free: "
                            << bytes(available) << " of " << bytes(static_cast<double>(memory->totalBytes))
                            << " (cudaMemGetInfo; " << fitHint(in, run, available) << kLowerTheRest << ")";
}

}  // namespace

void checkMemoryEstimate(const MemoryEstimateInputs& in, const runtime::WorldInfo& world, const runtime::Logger& log) {
  const Floor run = floorOfTheRun(in);
  const std::string what = describeFloor(in, run);
  if (world.rank == 0) warnVocabulary(in, log);
  if (in.report && world.rank == 0) reportEstimate(in, run, log);
  if (in.onGpu) {
    checkGpu(in, run, what);
  } else {
    checkHost(in, run, what, world);
  }
  if (run.total() >= double(1 << 30) && world.rank == 0) {
    log.info() << "memory: model " << in.model.name << " needs " << what;
  }
}

}  // namespace cohort::cli
