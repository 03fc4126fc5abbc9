// Optimizers over the flat parameter and gradient buffers (docs/architecture.md, "The decisions
// that shape everything", item 1), with PyTorch's exact update rules:
//   SGD   d = g + wd·p; on the first step buf = d, then buf = m·buf + d (dampening 0);
//         d = nesterov ? d + m·buf : buf; p −= lr·d
//   Adam  g += wd·p; m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²;
//         p −= lr/(1−β1ᵗ) · m / (sqrt(v)/sqrt(1−β2ᵗ) + ε)
//   AdamW p ·= 1 − lr·wd first, then Adam without weight decay in the gradient.
// State buffers are allocated once at construction (numel floats each), so step() allocates nothing.
// The state (buffers and the step count) is exposed for checkpoints. step() works on CPU buffers and
// may run against shared parameters (Hogwild): it reads and writes each parameter element once.
// GPU (CUDA builds): made with a GpuContext, the state lives on that GPU and step() enqueues one
// fused multi-tensor kernel over the flat buffers on its stream (runtime/cuda/elementwise.h,
// kernels.h): a chunk table built once covers every group's runs, and the step's options per
// distinct (decay, lr scale) are written into device memory by one tiny kernel before it.
// stepDeferred() is the same kernel for a step the device decides (train/step/step_guard.h): applied or
// not, the gradient's multiplier and the step count are device values the host learns later.
// Sharded (ZeRO-3 / FSDP2) training: makeShardOptimizer builds one over a rank's packed shard of an
// nn::ShardMap, its state sized to the shard, and stepShard() updates the real elements of each
// piece the rank owns, each with the arithmetic the whole-buffer step gives that element, so the
// ranks' shards after a step are bit for bit the slices of the whole step's buffer.
// Parameter groups (PyTorch's param_groups, over the flat layout): OptimizerOptions::groups give
// ranges of the whole model's flat buffer their own weight decay and learning-rate multiplier
// (nanoGPT's decay on the >= 2-D weights only: decayMatricesOnly). Every step looks the group of
// each element up from its flat index — a slice (stepSlice), a shard's pieces (stepShard,
// stepPieces, from each piece's flat range) or the whole buffer — and updates each run of one
// group with that group's numbers (on a GPU: the whole buffer in one kernel over its chunk table,
// a shard's pieces one kernel per piece and run), so any slice may cross groups and a shard's
// elements step as the whole buffer's do.
// Thread safety: one thread at a time per optimizer.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/shard_map.h"
#include "runtime/tensor.h"

namespace cohort::runtime::cuda {
class GpuContext;
struct StepControl;
struct OptimizerChunk;
}

namespace cohort::nn {

using runtime::Tensor;
class ParamBuffer;

enum class OptimizerKind { kSgd, kAdam, kAdamW };

// One parameter group: the elements [begin, end) of the whole model's flat buffer (ParamBuffer
// offsets), stepped with weight decay `weightDecay` and learning rate lr · lrScale (PyTorch's
// group "weight_decay" and "lr").
struct ParamGroup {
  size_t begin = 0, end = 0;
  float weightDecay = 0.0f;
  float lrScale = 1.0f;
};

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  float lr = 0.01f;
  float momentum = 0.0f;  // SGD
  bool nesterov = false;  // SGD
  float weightDecay = 0.0f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // Adam, AdamW
  // Empty: one group, every element with weightDecay and lr. Otherwise sorted by begin, not
  // overlapping, begin < end; elements outside every group take weightDecay and lr scale 1
  // (e.g. the alignment padding between a ParamBuffer's entries).
  std::vector<ParamGroup> groups = {};
};

// nanoGPT's configure_optimizers grouping for `params`' entries: weight decay `weightDecay` on every
// parameter of two or more dimensions (Linear and convolution weights, embedding tables), none on
// the rest (biases, LayerNorm and BatchNorm weights); lr scale 1. Adjacent entries of one kind
// share a group.
std::vector<ParamGroup> decayMatricesOnly(const ParamBuffer& params, float weightDecay);

class Optimizer {
 public:
  struct StateTensor {
    std::string name = {};  // "momentum_buffer", "exp_avg", "exp_avg_sq"
    Tensor tensor = {};
  };

  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // One run's numbers: the learning rate (lr · the group's scale) and weight decay.
  struct RunRate {
    float lr = 0;
    float weightDecay = 0;
  };
  // One update of `params` from `grads` (both flat, numel() elements).
  void step(const Tensor& params, const Tensor& grads);
  // GPU only: one update that `step.control` (device memory, runtime/cuda/step_guard.h) decides:
  // nothing unless it applies, the gradient multiplied by its multiplier, the step count
  // control->appliedBefore. steps() is the count the host has settled, and control->appliedBefore
  // is it or one more (a step still unread): each has its learning rate. steps() and lr are left as
  // they are: the caller sets them once it reads the step's record. Bit for bit step() after
  // scaling the gradient, with the same count and learning rate.
  struct DeferredStep {
    const runtime::cuda::StepControl* control = nullptr;
    float lrIfSettled = 0;  // control->appliedBefore == steps()
    float lrIfOneMore = 0;  // control->appliedBefore == steps() + 1
  };
  void stepDeferred(const Tensor& params, const Tensor& grads, const DeferredStep& step);
  // stepDeferred in its two halves, for a step whose device work a CUDA graph captures
  // (train/step_graph.h): stageDeferred writes the step's options (learning rates, bias corrections,
  // for both counts) into the optimizer's device arguments (one kernel, which must not be captured:
  // enqueue it before the graph's launch); applyDeferred enqueues the update, which reads them
  // through a pointer that never changes (one kernel, which a graph may capture). stepDeferred is
  // stageDeferred then applyDeferred.
  void stageDeferred(const DeferredStep& step);
  void applyDeferred(const Tensor& params, const Tensor& grads, const runtime::cuda::StepControl* control);
  // GPU: the bf16 copy of the parameters the whole-buffer steps (step(), stepDeferred()) keep: device
  // memory of numel() bf16 values laid out as the flat buffer, into which the step's kernel also
  // writes bf16(new value) (rounded to nearest even, as runtime/cuda's convertToBf16) at the index
  // of every element it updates; a step not applied writes nothing, so the copy still matches.
  // nullptr: none (the default). The memory must outlive the steps that write it. InvalidArgument
  // for an optimizer on the CPU or over a shard.
  void setHalfCopy(void* bf16Flat);
  void* halfCopy() const { return half_; }
  virtual std::vector<StateTensor> state() const = 0;

  // One step over elements [begin, end) only (CPU): a worker that owns that shard of the parameters
  // in synchronous sharded training (nn/sharded_sync.h). `prepareBlock(b, e)`, when given, runs
  // before each block [b, e) of at most 1024 elements is updated (e.g. to average that block of the
  // gradient across ranks), while the block is hot in the cache. Counts as one step.
  using BlockHook = std::function<void(int64_t begin, int64_t end)>;
  void stepSlice(const Tensor& params, const Tensor& grads, int64_t begin, int64_t end, const BlockHook& prepareBlock);

  // One update of a rank's packed shard (shard.numel() == numel(), the map's shardNumel()) for an
  // optimizer made by makeShardOptimizer: on the CPU the real elements of each piece, the padding
  // untouched; on a GPU the whole shard in one kernel, which leaves padding that is zero in both
  // buffers zero (p = 0, g = 0 and zero state give 0 under every rule). Counts as one step. Throws
  // InvalidArgument for an optimizer not made over a shard map or buffers of another size.
  void stepShard(const Tensor& values, const Tensor& grads);
  // The same where the values or the gradients are not packed: each piece's real elements read from
  // the packed shard (packed) or from the piece's place in a flat buffer of the whole model
  // (flatBegin..flatEnd); the state is the shard's. ZeRO 1 and 2 keep the whole parameter buffer
  // and step its owned pieces in place. `prepare`, when set, runs before each piece is updated
  // (e.g. to scale its gradient while it is hot). On a GPU (the buffers device memory of the
  // optimizer's GPU) one kernel per piece over its offset pointers, enqueued on the stream after
  // `prepare` enqueued its own; each element's update is the whole-buffer kernel's. Counts as one
  // step.
  struct PieceBuffers {
    float* values = nullptr;
    bool valuesPacked = false;
    const float* grads = nullptr;
    bool gradsPacked = false;
    std::function<void(const ShardMap::Piece&)> prepare = {};
  };
  void stepPieces(const PieceBuffers& buffers);
  // Makes a fresh optimizer (no step taken: InvalidArgument otherwise) one over `map`'s rank's
  // shard, as makeShardOptimizer would have: its state is replaced by zeroed shard-sized state.
  // What a sharded placement does with the optimizer a program made for the whole model.
  void shardOver(const ShardMap& map);
  bool sharded() const { return sharded_; }
  const std::vector<ShardMap::Piece>& shardPieces() const { return pieces_; }

  // Total floats of state (0 for plain SGD) and placing it in `memory` (CPU, stateFloats() floats,
  // 64-byte aligned, owned by the caller and outliving the optimizer), e.g. a segment shared by the
  // workers that each update their own shard of it. The memory's contents become the state: the
  // current values are not copied (a fresh segment is zeroed, which is every optimizer's initial state).
  size_t stateFloats() const;
  void placeState(float* memory);

  // Hogwild: workers sharing the parameters start their sweep at different elements (wrapping
  // around), so they do not fight over the same cache lines at the same moment. The update of each
  // element is the same whatever the order.
  void setSweepStart(size_t element) { sweepStart_ = element; }

  // The length of the flat buffers this optimizer was made for, and where its state lives.
  size_t numel() const { return numel_; }
  runtime::Device device() const;

  int64_t steps() const { return steps_; }
  void setSteps(int64_t steps) { steps_ = steps; }
  const OptimizerOptions& options() const { return options_; }
  void setLr(float lr) { options_.lr = lr; }

 protected:
  Optimizer(const OptimizerOptions& options, size_t numel, runtime::cuda::GpuContext* gpu)
      : options_(options), numel_(numel), gpu_(gpu) {
    makeRuns();
  }
  // A zeroed state buffer of `numel` floats on the optimizer's device.
  Tensor zeroState(size_t numel) const;
  // Updates n elements of one group for the step being taken (steps_ not yet incremented):
  // params[0..n) and grads[0..n) with the state's elements [stateBegin, stateBegin + n).
  virtual void stepRange(float* params, const float* grads, int64_t stateBegin, int64_t n, const RunRate& rate) = 0;
  virtual void beginStep() {}
  // The update of n elements whose first is element flatBegin of the whole flat buffer, cut into
  // runs of one group each (stepRange, or stepGpuRange on a GPU).
  void update(float* params, const float* grads, int64_t stateBegin, int64_t flatBegin, int64_t n);
  // update over [begin, end) in blocks, prefetching the parameter lines ahead for writing; element
  // i is element i + flatShift of the whole flat buffer.
  void sweep(float* params, const float* grads, int64_t begin, int64_t end, const BlockHook* prepareBlock = nullptr,
             int64_t flatShift = 0);
  RunRate rateOf(const ParamGroup& run, float lr) const;
  // The state tensors, for placeState() (a subset of state(), same order).
  virtual std::vector<Tensor*> stateTensors() = 0;
  // The update of n elements on the GPU (params and grads device buffers of gpu_'s device), with
  // the state's elements [stateBegin, stateBegin + n), for the step being taken; one kernel.
  virtual void stepGpuRange(float* params, const float* grads, int64_t stateBegin, int64_t n, const RunRate& rate) = 0;
  // The whole-buffer GPU steps (step(), stepDeferred()) are one multi-tensor kernel over the chunk
  // table (runtime/cuda/step_guard.h, OptimizerChunk): stageGpu writes the step's options per rate
  // into stepArgs_ (uncaptured), applyGpu enqueues the kernel over params and grads (numel()
  // elements each; control null: an undecided step, applied with ifSettled).
  struct GpuStep {
    int64_t settledSteps = 0;
    float lrIfSettled = 0, lrIfOneMore = 0;
  };
  virtual void stageGpu(const GpuStep& step) = 0;
  virtual void applyGpu(float* params, const float* grads, const runtime::cuda::StepControl* control) = 0;
  // Builds the chunk table and the step arguments' device memory, once (CUDA builds, gpu_ set).
  void prepareGpu();
  const runtime::cuda::OptimizerChunk* chunks() const;
  // Throws InvalidArgument unless params and grads are on this optimizer's GPU.
  void requireGpuBuffers(const Tensor& params, const Tensor& grads) const;
  // And that both are numel() elements long.
  void requireWholeGpuBuffers(const Tensor& params, const Tensor& grads) const;
  OptimizerOptions options_;
  size_t numel_ = 0;
  int64_t steps_ = 0;
  size_t sweepStart_ = 0;
  runtime::cuda::GpuContext* gpu_ = nullptr;
  bool sharded_ = false;  // made over a shard map, whose rank's pieces are:
  std::vector<ShardMap::Piece> pieces_;
  // options_.groups with the gaps filled, adjacent equal ones merged: sorted runs tiling the flat
  // index space [0, SIZE_MAX).
  std::vector<ParamGroup> runs_;
  // The runs' distinct (weightDecay, lrScale), in order of first appearance: the chunks' rates.
  std::vector<ParamGroup> rates_;
  Tensor chunkTable_;  // GPU: the OptimizerChunks over [0, numel()), made by prepareGpu
  int chunkCount_ = 0;
  Tensor stepArgs_;  // GPU: the step's OptimizerStepArgs (of the optimizer's options type)
  void* half_ = nullptr;  // setHalfCopy's

 private:
  void makeRuns();
  // Calls visit(offset, count, run) for each run of one group within flat [flatBegin, flatBegin + n).
  template <class Visit>
  void forEachRun(int64_t flatBegin, int64_t n, Visit visit) const;

  friend std::unique_ptr<Optimizer> makeShardOptimizer(const OptimizerOptions&, const ShardMap&,
                                                       runtime::cuda::GpuContext*);
};

// Validates the options (lr > 0, momentum in [0, 1), betas in [0, 1), eps > 0, weight decay >= 0,
// nesterov only with momentum; groups sorted, not overlapping, inside [0, numel), decay >= 0 and
// lr scale > 0) and makes the optimizer for buffers of `numel` elements, with its
// state on `gpu`'s device when given (CUDA builds), else on the CPU.
std::unique_ptr<Optimizer> makeOptimizer(const OptimizerOptions& options, size_t numel,
                                         runtime::cuda::GpuContext* gpu = nullptr);

// The same, for the packed shard of rank map.rank(): numel() is map.shardNumel(); the groups are
// over the whole flat buffer (inside [0, map.numel())).
std::unique_ptr<Optimizer> makeShardOptimizer(const OptimizerOptions& options, const ShardMap& map,
                                              runtime::cuda::GpuContext* gpu = nullptr);

OptimizerKind parseOptimizerKind(const std::string& name);  // sgd | adam | adamw

}  // namespace cohort::nn
