// ShardSync: the collectives and buffers of sharded data parallel (ZeRO 1-3) over an nn::ShardMap of
// the model's parameter units (docs/sharding.md). It is the pass's unit listener: the model tells
// it as each unit is computed with, and it gathers, reduce-scatters and frees around that.
//
// A unit of n elements at flat offset o is cut into W pieces of P elements (P = ceil(n/W)); rank r
// owns piece r. What lives where, by stage:
//   stage 1  the whole parameter and gradient buffers (ParamBuffer's); each unit's gradient is
//            reduce-scattered (averaged) in place, NCCL's layout: input [o, o + n), output this
//            rank's piece [o + r·P, o + (r + 1)·P), or through the unit's staging buffer of P·W
//            floats where the unit is padded (n < P·W), the real part copied back to its place;
//   stage 2  the whole parameter buffer; no whole gradient buffer: a unit's gradient lives in a
//            window (WindowPool, P·W zeroed floats) from its beforeBackward to its reduce-scatter,
//            which runs in place in the window, its piece then added to the packed gradient shard
//            (shardNumel floats) and the window handed back;
//   stage 3  no whole buffer at all: the packed parameter shard; a unit's parameters are gathered
//            into a window before its forward (the next unit's gather prefetched meanwhile), freed
//            after it, gathered again before its backward (the previous unit's prefetched), freed
//            after it; gradients as stage 2.
// Units nobody reports (implicit units, ParamBuffer::Unit::declared false) keep windows for the
// whole run at stages 2 and 3 (their parameters gathered after every update).
// Micro-batches: the gradient of every micro-batch of a step adds into the unit's gradient (the
// layers accumulate), and the reduce-scatter runs after the last one, as stage 0's all-reduce does:
// the same arithmetic, so the same bits. At stages 2 and 3 the windows of a unit therefore stay
// from the first micro-batch's backward to the last's (FSDP's no_sync): with K > 1 micro-batches
// the whole gradient is held during the step's backward passes.
// bf16 runs (ShardSyncOptions::precision kBF16, GPUs): the optimizer updates the fp32 master (this
// rank's pieces: of the whole buffer at stages 1 and 2, the packed shard at 3), and every gather of
// parameters for the passes sends each unit that holds a bf16-read parameter as a wire message
// (GatherPlan, gather_plan.h, says the layout). The pieces cut a unit's mixed layout anywhere (a
// block's LayerNorm parameters, read exactly, lie between its Linears' in some pieces only), so a
// piece's message is its elements in order, one 16-bit word for a bf16-read element (rounded as the
// Linear rounds) and two for an exact one (its fp32 bits), and every rank's slot is as long as the
// longest piece's: one all-gather moves them all. The rank packs its piece from the master into its
// slot of a message buffer (pool_, W·words(u) 16-bit words; the pack kernel on the compute stream),
// one all-gather typed bf16 of words(u) per rank moves every slot, and after waitOn the unpack kernel
// writes the unit's fp32 elements: the bf16-read ones widened from bf16 (exactly the value a bf16
// pass reads: nn::Linear's conversion of it gives the same bits), the others exactly, so the passes
// compute with stage 0's bf16 values. Where: stage 3 unpacks every rank's slot into the unit's
// window (its own piece too: the window is a copy; the master stays in the shard), the message
// buffer going back to the pool at once; stages 1 and 2 unpack the other ranks' slots into the whole
// buffer after an applied step (this rank's piece there is the master: it keeps its fp32 bits), at
// most kMessagesInFlight messages held, the oldest unpacked (the compute stream waits, not the host)
// before the next is packed. So the whole buffer of a bf16 run at stages 1 and 2 holds the other
// ranks' bf16-read parameters rounded (what every bf16 pass reads); gatherAll (stage 3) and
// gatherShard gather exactly, in fp32. Units without a bf16-read parameter (a GPT's embeddings and
// ln_f) are gathered in fp32 as in fp32 runs. The host waits for nothing new.
// Scope node (PyTorch's HYBRID_SHARD): the map spans this node's ranks; `cross` joins this local rank
// of every node, over which each averaged piece is averaged again after its reduce-scatter.
// On a GPU (ShardSyncOptions::gpu; the communicator nccl given the compute stream) the windows, the
// shards and the staging are device memory from the GPU's caching allocator (ShardMemory), every
// copy and fill is enqueued on the compute stream, and nothing here waits on the host: a
// collective starts after the compute stream's work so far (so after the kernels that wrote its
// input), and its result is used after Work::waitOn(compute stream) (the stream, not the host,
// waits). A window is reused only after the collectives that used it are ordered before the reuse:
// a gradient window goes back to the pool only in placeReduced, after the compute stream was made
// to wait for its reduce-scatter, and a later take fills it on that stream; a parameter window
// goes back after the forward or backward kernels that read it were enqueued, and the gather that
// next writes it starts after them (the communicator's event). The host runs ahead of the device,
// so a reduce-scatter is rarely seen done when the next unit asks for a window: beyond
// kReduceScattersInFlight in flight, the oldest is placed (the compute stream waits for it). The CPU
// does the same (its host waits), for a backward faster than the reduce-scatters would otherwise
// take a window for every unit.
// Order: every rank builds the same map and issues the same collectives in the same order (the
// model's events are the same on every rank), which the communicators' fingerprints check. Every
// wait is bounded by the timeout.
// Ownership: borrows the communicators, the map, the ParamBuffer (bound on the CPU, or on the GPU;
// at stages 2 and 3 it drops the ParamBuffer's whole buffers and points each unit's tensors at its
// windows) and the GpuContext.
// Thread safety: the training thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <vector>

#include "collectives/communicator.h"
#include "nn/module.h"
#include "nn/param_buffer.h"
#include "nn/shard_map.h"
#include "runtime/dtype.h"
#include "train/observe/timeline.h"
#include "train/placement/gather_plan.h"
#include "train/placement/shard_memory.h"
#include "train/placement/window_pool.h"

namespace cohort::train {

// GPU: the reduce-scatters of gradient windows left in flight when a unit asks for a window.
constexpr size_t kReduceScattersInFlight = 2;

struct ShardSyncOptions {
  int stage = 1;                               // 1, 2 or 3
  bool prefetch = true;  // stage 3: gather the next unit (forward) or the previous (backward) meanwhile
  collectives::Communicator* cross = nullptr;  // scope node across nodes; nullptr: none
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  Timeline* timeline = nullptr;
  runtime::cuda::GpuContext* gpu = nullptr;  // the buffers on this GPU; nullptr: the CPU
  // The passes' precision: kBF16 sends the parameters they read as bf16 in bf16 (the header).
  runtime::DType precision = runtime::DType::kF32;
};

class ShardSync final : public nn::UnitListener {
 public:
  // The parameters must be current in the ParamBuffer's whole buffer: stage 3 packs this rank's
  // pieces from it before dropping it.
  ShardSync(collectives::Communicator& shard, const nn::ShardMap& map, nn::ParamBuffer& params,
            const ShardSyncOptions& options);

  // The pass of micro-batch k of K is about to run (the gradient windows stay until the last's
  // reduce-scatter).
  void beginPass(int microBatch, int microBatches);
  void beforeForward(const nn::ParamBuffer::Unit& unit) override;
  void afterForward(const nn::ParamBuffer::Unit& unit) override;
  void beforeBackward(const nn::ParamBuffer::Unit& unit) override;
  // The unit's gradient is final: starts its reduce-scatter after the last micro-batch. A unit
  // reported twice in one backward is a broken model (COHORT_CHECK).
  void afterBackward(const nn::ParamBuffer::Unit& unit) override;
  // Starts the reduce-scatters nobody reported, waits for all of them, averages the pieces across
  // nodes (scope node) and readies the next step. This rank's averaged pieces are then at their
  // places: the whole gradient buffer's pieces (stage 1) or the packed gradient shard.
  void finishGradients();
  // After the update: stages 1 and 2 all-gather every unit's parameters into the whole buffer;
  // stage 3 the implicit units' into their windows (the others are gathered when computed with).
  void gatherParams();
  // Stage 3 (nothing at 1 and 2): every unit's parameters gathered into windows (exactly, in fp32,
  // in bf16 runs too), until releaseAll() gives them back; collective.
  void gatherAll();
  void releaseAll();
  // All-gathers rank-packed `shard` (map.shardNumel() floats) into the flat buffer `flat` (the map's
  // numel()), e.g. an optimizer state for a checkpoint; both in memory(). On the CPU it waits; on a
  // GPU the compute stream does.
  void gatherShard(const float* shard, float* flat);

  // Where the optimizer finds this rank's gradient pieces and parameter pieces.
  bool gradsPacked() const { return stage_ >= 2; }
  float* grads();  // the packed gradient shard, or the whole gradient buffer
  bool valuesPacked() const { return stage_ == 3; }
  float* values();  // the packed parameter shard, or the whole parameter buffer
  // A fresh packed copy of this rank's pieces of the parameters (map.shardNumel() floats in
  // memory(), zero padding): the master, whatever the whole buffer holds of the others' pieces.
  runtime::Tensor packedValues() const;
  // Whether the passes' gathers send some parameters as bf16 (a bf16 run with a bf16-read one).
  bool gathersBf16() const { return plan_.has_value(); }
  const ShardMemory& memory() const { return memory_; }

  size_t stagingBytes() const;  // the padded units' staging, the windows' pool and the wire table
  size_t shardBytes() const;    // the packed shards this object holds (gradients, parameters)
  uint64_t reduceScatters() const { return reduceScatters_; }
  // The bytes this rank's all-gathers have received so far (W times each one's per-rank count times
  // its element's size): the parameters' gathers, and gatherShard's.
  uint64_t gatheredBytes() const { return gatheredBytes_; }

 private:
  struct UnitState {
    bool padded = false;
    bool declared = false;
    runtime::Tensor staging;  // stage 1, padded units: P·W floats
    float* gradWindow = nullptr;   // stages 2, 3
    float* valueWindow = nullptr;  // stage 3
    float* message = nullptr;      // bf16 runs: the unit's wire message while it is gathered
    collectives::WorkPtr reduce, gather;
    bool reduced = false;  // its reduce-scatter started this step
  };
  size_t padded(size_t u) const { return map_.pieceNumel(u) * static_cast<size_t>(map_.worldSize()); }
  size_t unitAt(size_t flatOffset) const;
  void startReduce(size_t u);
  void placeReduced(size_t u);
  void reapReduced();
  // The compute stream waits for `work` (GPU), or the host does (CPU); then it is let go.
  void await(collectives::WorkPtr& work);
  // What a gather of parameters moves: the passes' form (bf16 for a wire unit of a bf16 run), or
  // every element exactly.
  enum class Form { kForPasses, kExact };
  bool sendsWire(size_t u, Form form) const { return form == Form::kForPasses && plan_ && plan_->wire(u); }
  collectives::WorkPtr allGather(const void* input, void* output, size_t countPerRank, runtime::DType type);
  // Packs this rank's piece of unit u (its first element at `piece`) into its slot of a fresh message
  // buffer (s.message) and starts the all-gather of every slot.
  collectives::WorkPtr startMessage(size_t u, const float* piece);
  // Unpacks every slot of u's message but rank `keep`'s (-1: none) into the unit's elements at
  // `unit`, and hands the buffer back to the pool.
  void finishMessage(size_t u, float* unit, int keep);
  void startGather(size_t u, Form form);  // stage 3
  void finishGather(size_t u);            // stage 3: its gather awaited, its message unpacked
  void releaseValues(size_t u);
  void gatherWhole();  // stages 1 and 2: every unit into the whole buffer (the passes' form)
  void finishWhole(size_t u, collectives::WorkPtr& work, float* staged);
  size_t neighbour(size_t u, int direction) const;  // the next declared unit that way, or units()

  collectives::Communicator& shard_;
  const nn::ShardMap& map_;
  nn::ParamBuffer& params_;
  ShardSyncOptions options_;
  int stage_;
  std::vector<UnitState> units_;
  std::map<size_t, size_t> unitOfOffset_;  // a unit's flat offset -> its index in the map
  ShardMemory memory_;
  runtime::Tensor gradShard_, valueShard_;
  WindowPool pool_;
  std::optional<GatherPlan> plan_;  // bf16 runs with a bf16-read parameter
  runtime::Tensor wireTable_;       // plan_->table() in memory_
  std::vector<size_t> reduceOrder_;  // this step's reduce-scatters, units in issue order
  int microBatch_ = 0, microBatches_ = 1;
  uint64_t reduceScatters_ = 0;
  uint64_t gatheredBytes_ = 0;
};

}  // namespace cohort::train
