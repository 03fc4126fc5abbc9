// Job: one process's part in a distributed training job — the public entry point of Cohort
// (docs/api.md). A program creates one Job in main; it detects the world (cohortrun's, Open MPI's,
// SLURM's or PMI's variables; runtime/world_info.h), checks the options against it, selects the
// device, and, given the model and its optimizer, places the parameters where the mode needs them
// and gives the training loop what it needs: the pass for forward/backward, one call that
// synchronises the gradients and steps, collectives over scalars, and checkpoints of the whole job.
//
// Modes (docs/architecture.md, "One training step"):
//   local      one process; parameters private (CPU or one GPU).
//   hogwild    every worker of the node updates the node's one shared copy without locks (CPU:
//              shared memory; GPU: one device allocation shared through CUDA IPC). Across nodes
//              (CPU): the nodes' copies are averaged over MPI every `averageEvery` steps, overlapped
//              with training, and fully at every collective (train/placement/node_averaging.h).
//   allreduce  synchronous data parallel: every step applies the average of all workers'
//              gradients. Over shm on one node: one shared copy, each worker updating its slice
//              (or, with `replicas`, a replica per worker and bucketed all-reduce); over mpi (any
//              number of nodes) and nccl (GPUs): a replica per worker, rank 0's parameters
//              broadcast, gradient buckets all-reduced while backward runs.
//
// Order of calls (every rank of the job, alike):
//   Job job(options);                        // world, device; validation (InvalidArgument)
//   job.place(model, optimizer, {.seed});    // collective: segments / communicator, initial parameters
//   loop: pass() -> model forward, loss, model backward(pass) -> step({.clipGradNorm, .loss})
//   save(path) / load(path), barrier(), mean()...   // collective
// place() must come before anything else that touches the model; it may be called once.
//
// Gradient accumulation (DDP's no_sync): K micro-batches per optimizer step, passes
// pass({.microBatch = k, .microBatches = K}) for k = 0..K-1: the first overwrites the gradients, the
// others add to them, and only the last synchronises (in allreduce its backward starts the bucket
// all-reduces). step() then averages: it scales the summed gradients by 1/K, so K micro-batches of
// b samples give the step of one batch of K·b (PyTorch's loss / K, done for you).
//
// Deferred results (GPU, train/step.h "When results arrive"): step({.deferResult = true}) queues the
// step and returns a pending result; settleStep() returns the results in step order. A loop that
// overlaps queues step n + 1, then settles step n:
//   job.step({.deferResult = true, .lrAt = schedule});   // step n + 1
//   while (job.pendingSteps() > 1) use(*job.settleStep());   // step n
// and drains (settleStep() until nullopt) before it saves, evaluates or stops.
//
// Ownership: the Job owns everything it creates — the GPU context, segments, communicators, the
// device share — and releases it when destroyed (segment names are removed once every rank has
// attached). It borrows the model and the optimizer given to place() for its use, and its
// destruction touches neither; make the Job first, as the examples do: on a GPU the model's and
// optimizer's tensors come from the Job's allocator, so they must be destroyed before the Job.
// Only one Job may exist in a process at a time (InvalidArgument otherwise): its segments and
// communicators are named by the job. With several ranks, the constructor claims this rank in the
// node's roster of the job (ipc/rank_roster.h; InvalidArgument naming the holder when another live
// process holds it: two jobs of one id), so that peers know this process from then on; ending the
// Job normally (destroyed other than by an exception) marks the rank finished. A process that exits
// 0 while its Job exists and other ranks still run counts as having left early (cohortrun exit 4). Errors:
// InvalidArgument for misuse (messages name the problem), TimeoutError / PeerError naming the rank a collective waited
// for, IoError for files. Thread safety: one thread drives a Job (the training thread).
//
//   train::Job job({.mode = train::Mode::kAllReduce});
//   job.place(model, *optimizer, {.seed = 1});
//   for (Batch b; loader.next(b);) {
//     nn::Pass pass = job.pass();
//     loss.forward(model.forward(b.inputs, pass), b.targets);
//     model.backward(loss.backward(), pass);
//     job.step();
//   }
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/model.h"
#include "nn/module.h"
#include "nn/optimizer.h"
#include "runtime/allocator.h"
#include "runtime/data/data_loader.h"
#include "runtime/device.h"
#include "runtime/gpu_options.h"
#include "runtime/logging.h"
#include "runtime/world_info.h"
#include "train/checkpoint/checkpoint_options.h"
#include "train/observe/timeline.h"
#include "train/placement/placement_choice.h"
#include "train/settings.h"
#include "train/spike_detector.h"
#include "train/state_bytes.h"
#include "train/step.h"
#include "train/test_hooks.h"

namespace cohort::runtime::cuda {
class GpuContext;
}

namespace cohort::train {

class Checkpointer;
class Placement;
class StepGuard;
struct Placed;

// Mode, Backend, ParamCopies and their words: train/placement/placement_choice.h.
struct JobOptions {
  Mode mode = Mode::kLocal;
  // kAllReduce: what carries the gradients; kAuto: nccl on a GPU, shm on one node, hierarchical
  // across nodes (flat mpi where the nodes run different numbers of workers).
  Backend backend = Backend::kAuto;
  // kAllReduce on the CPU: a full replica per rank and the bucketed all-reduce (kReplicas), or one
  // shared copy per node that the node's ranks update in slices (kSharedPerNode: over shm, or
  // hierarchical across nodes). kAuto: shared on one node; replicas across nodes, where the
  // buckets' all-reduce overlaps backward and trains faster (docs/nn.md).
  ParamCopies paramCopies = ParamCopies::kAuto;
  // kAllReduce: sharded data parallel (ZeRO, docs/sharding.md): 0 keeps a full replica per rank; 1
  // shards the optimizer state over the ranks (gradients reduce-scattered, each rank updates its
  // shard, the parameters all-gathered); 2 shards the gradients too; 3 the parameters too. Other
  // modes refuse a stage above 0 (InvalidArgument), and so does ParamCopies::kSharedPerNode.
  int zero = 0;
  // Over which ranks ZeRO shards: the job's, or each node's (the shards replicated across nodes).
  ZeroScope zeroScope = ZeroScope::kJob;
  // ZeRO 3: gather the next unit's parameters while the current one computes (forward: the next
  // unit; backward: the previous one). Off only to measure what it buys (bench/compare_zero.sh).
  bool zeroPrefetch = true;
  // "cpu", "cuda" (the GPU of this rank's local rank: one worker per GPU) or "cuda:N".
  std::string device = "cpu";
  // Every wait for other ranks (start-up, barriers, collectives); then TimeoutError naming them.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // kHogwild across nodes: each node's leader averages the node's copy with the other nodes' every
  // this many of its steps (and every collective averages fully); 0: kDefaultAverageEvery. No effect
  // on one node; other modes refuse a value > 0. Negative: InvalidArgument.
  int64_t averageEvery = 0;
  // On a GPU, which cuDNN convolution algorithms the layers may choose (runtime/gpu_options.h):
  // kFastest, the fastest measured (Winograd and FFT included, about 1e-3 from fp32 accumulation), or
  // kExact, only those that match plain fp32 accumulation. No effect on the CPU.
  runtime::ConvAlgorithms convAlgorithms = runtime::ConvAlgorithms::kFastest;
  // On a GPU, whether fp32 matrix products may use TF32 tensor cores (runtime/gpu_options.h).
  // InvalidArgument on the CPU.
  bool tf32 = false;
  // On a GPU, whether cuBLASLt's candidate algorithms are timed per product shape
  // (GpuOptions::tuneGemms: nullopt leaves it to COHORT_GEMM_TUNING, else on). No effect on the CPU.
  std::optional<bool> gemmTuning = std::nullopt;
  // What the model's passes compute in (nn::Pass::precision; docs/architecture.md): fp32, or bf16
  // on a GPU. bf16 on the CPU is InvalidArgument, and so is a model that does not take bf16
  // (Module::takesBf16) at place().
  runtime::DType precision = runtime::DType::kF32;
  // Faults and records for tests (train/test_hooks.h); all off by default.
  TestHooks testHooks = {};
};

// The placement a Job with `options` makes on `world` (train/placement/placement_choice.h): a pure function,
// the one Job's constructor calls (InvalidArgument as resolvePlacement).
ResolvedPlacement resolvePlacement(const JobOptions& options, const runtime::WorldInfo& world);

// JobOptions::averageEvery when 0: a round every 16 steps of a node's leader (with 2 workers a node,
// about 32 updates of each copy per round).
inline constexpr int64_t kDefaultAverageEvery = 16;

struct PlaceOptions {
  // The default initialisation: Module::resetParams from an Rng seeded by `seed` (PyTorch's
  // default initialisers), identical on every rank and device.
  uint64_t seed = 0;
  // Instead of that: fills the parameters (model.params, bound on the CPU) itself, e.g. from the
  // user's own scheme. Runs where the mode needs it (every rank, or the rank that creates the
  // shared copy), always on the CPU; the Job then moves the values where they belong.
  std::function<void(nn::Model& model)> initialise = {};
  // More settings that must be the same on every rank (e.g. the data set), compared together with
  // those the job knows itself (see Job::place).
  Settings settings = {};
};

struct PassOptions {
  int microBatch = 0;           // k in [0, microBatches)
  int microBatches = 1;         // K >= 1: gradients of K micro-batches per step (see the header comment)
  runtime::Rng* rng = nullptr;  // dropout masks; layers with dropout need one while training
};

// What a loop's figures add up to over the ranks.
enum class Reduce { kSum, kMean, kMax };

class Job {
 public:
  explicit Job(const JobOptions& options);  // the world from the environment
  Job(const JobOptions& options, const runtime::WorldInfo& world);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const runtime::WorldInfo& world() const { return world_; }
  const JobOptions& options() const { return options_; }
  runtime::Device device() const { return device_; }
  // This rank's GPU (stream, caching allocator, cuBLAS/cuDNN handles); nullptr on the CPU.
  runtime::cuda::GpuContext* gpu() const;
  // Where the gradients are averaged: "none" (local, hogwild), "shm", "mpi", "hierarchical" or
  // "nccl": the resolved choice, and after place() what the communicator got (flat "mpi" where
  // the nodes turned out uneven and the choice allowed it).
  std::string backend() const;
  // Hogwild across nodes: the leader steps between two averaging rounds (averageEvery resolved); 0
  // where the mode does not average parameters (other modes, Hogwild on one node).
  int64_t averageEvery() const;
  // Rank-prefixed lines on standard output.
  const runtime::Logger& log() const { return log_; }

  // Collective: places `model`'s parameters (unbound; registered by nn::Model) and the optimizer's
  // state for the mode and initialises them (see PlaceOptions). InvalidArgument when called twice,
  // when the optimizer was made for another size or device, or the model is already bound.
  // First it checks that every rank has the same settings (agree()): the mode, backend, replicas,
  // device kind and world size; the model's name, parameter count and layout (names and shapes);
  // the optimizer and its hyper-parameters; the seed; the convolution algorithms; and options.settings. Another rank's
  // different setting is an InvalidArgument on every rank, naming both ranks and both values.
  void place(nn::Model& model, nn::Optimizer& optimizer, const PlaceOptions& options = {});
  // The optimizer place() wants for `model` (registered, not bound): with a ZeRO stage, one over
  // the rank's shard of the model's units (nn::makeShardOptimizer), so that the whole state is never
  // allocated; otherwise nn::makeOptimizer's for the whole model, on this job's device. An optimizer
  // made for the whole model is accepted too: place() then shards it, after allocating it whole.
  std::unique_ptr<nn::Optimizer> makeOptimizer(const nn::OptimizerOptions& options, const nn::Model& model) const;
  bool placed() const { return placed_ != nullptr; }
  nn::Model& model() const;
  nn::Optimizer& optimizer() const;

  // The pass for one training micro-batch: training mode, this job's GPU, the gradient hooks of the
  // mode, accumulation as PassOptions say.
  nn::Pass pass(const PassOptions& options = {});
  // The pass for evaluation: no training (dropout off, BatchNorm on its running statistics), this
  // job's GPU, no gradients.
  nn::Pass evalPass() const;
  // Collective in lockstep modes: synchronises this step's gradients, measures their global norm,
  // and applies the optimizer (clipped as `options` say), unless the loss or the gradient is
  // non-finite: then nothing is updated and the result says which (train/step.h). Call it after the
  // backward of the last micro-batch (InvalidArgument otherwise, and for a negative or non-finite
  // clipGradNorm). With options.deferResult the result is pending (train/step.h) and comes from
  // settleStep(); a deferred step may follow at most one pending one, and a synchronous step none
  // (InvalidArgument otherwise).
  StepResult step(const StepOptions& options = {});
  // The oldest deferred step's result, waiting for that step's decision only (bounded by the job's
  // timeout, TimeoutError); nullopt when none is pending. It sets the optimizer's step count and
  // learning rate to what the device applied. Not collective: every rank that steps together
  // settles the same results.
  std::optional<StepResult> settleStep();
  // Deferred steps whose result settleStep() has not returned yet.
  size_t pendingSteps() const;
  // Whether ranks step together (false for Hogwild, whose workers meet only at barriers).
  bool lockstep() const;
  // Whether the ranks of a node share one copy of the parameters (Hogwild; allreduce on the CPU
  // without replicas), rather than each holding its own.
  bool sharedParams() const;
  // kAllReduce: whether every rank keeps a replica (JobOptions::paramCopies resolved; always on a GPU
  // and over mpi). False in the other modes.
  bool replicas() const;
  // bf16 runs on a GPU whose placement alone writes the values (local, replicas; not ZeRO or
  // Hogwild): with `trust`, makes the model's bf16 copy current and trusts it (nn/param_buffer.h,
  // "The bf16 copy"): each step and load() keep it current, and the passes convert nothing. Returns
  // whether it is trusted; false elsewhere (the passes refresh it). The Trainer trusts it for its
  // run; a loop of one's own may too, if it writes the values in no other way. Not collective.
  bool trustHalfCopy(bool trust);
  // Where the parameters live and what carries the collectives, resolved from the options and the
  // world by resolvePlacement (train/placement/placement_choice.h) when the Job was made; place() agrees on it
  // and makes exactly that.
  const ResolvedPlacement& placementChoice() const { return choice_; }

  // Collective: InvalidArgument on every rank when any rank's `settings` differ from rank 0's,
  // naming the ranks and the first differing setting with both values (nothing happens in a world
  // of one). Each call compares its own list; call it before anything relies on the settings.
  // Bounded by the job's timeout (TimeoutError naming the ranks that did not arrive).
  void agree(const Settings& settings);

  // Collectives (every rank, same order). In Hogwild they line the workers up: call them where all
  // workers are, e.g. at the end of an epoch.
  void barrier(const std::string& what);
  void reduce(std::span<double> values, Reduce op);
  double mean(double value);
  // True on every rank when any rank says so (stop votes).
  bool any(bool mine);

  // Checkpoints of the whole job (collective): parameters, model buffers, optimizer state and
  // `extra` metadata (the loop's position, strings). load() returns the metadata, or nullopt when
  // there is no file at `path`; it refuses (InvalidArgument) a checkpoint of another model,
  // optimizer or world size, or whose `mustMatch` values differ. Both refuse (InvalidArgument)
  // while deferred results are pending.
  // A sharded job (zero >= 1) writes a sharded checkpoint: each rank its shard file, rank 0 the
  // manifest at `path` once every file is durable (the commit point; docs/checkpoints.md, "Sharded
  // checkpoints in training"); nothing is gathered on one rank. With options.async (sharded jobs
  // only, InvalidArgument otherwise) save() returns once this rank's shard is copied to staging; the
  // checkpoint is committed by settleCheckpoint(), the next save() or a load(), and one is in flight
  // at most. load() takes either kind of checkpoint in any job (resharded for another world size or
  // stage, or assembled whole for a job that is not sharded).
  void save(const std::string& path, const nn::Metadata& extra = {}, const SaveOptions& options = {});
  std::optional<nn::Metadata> load(const std::string& path, const nn::Metadata& mustMatch = {});
  // Collective: commits the asynchronous checkpoint in flight once every rank's shard file is
  // durable: waiting for that (up to the job's timeout, TimeoutError), or with wait false only if it
  // already is. Returns what was committed; nullopt when nothing was (none in flight, or not yet).
  // IoError on every rank when a rank's write or the commit failed: that checkpoint is dropped and
  // the previous one stays. Call it before the program ends: an uncommitted checkpoint is lost.
  std::optional<CheckpointCommit> settleCheckpoint(const SettleOptions& options = {});
  // Whether an asynchronous checkpoint awaits settleCheckpoint() (the same on every rank).
  bool checkpointInFlight() const;

  // This rank's part of a dataset: `options` with rank and worldSize set (DistributedSampler's split).
  runtime::data::DataLoaderOptions dataSplit(runtime::data::DataLoaderOptions options) const;
  // After a failure in the loop: throws PeerError when the cause is a rank this one depends on
  // having gone (GPU Hogwild: the owner of the shared parameters), looking for up to `settle`.
  void checkPeers(std::chrono::milliseconds settle = std::chrono::seconds(1));
  // How many times this rank has reduced gradients across ranks: bucket all-reduces (replicas,
  // mpi, nccl) or slice reductions (the shared copy); 0 in local and Hogwild. With K micro-batches per step
  // it grows once per step (per bucket), not K times.
  uint64_t gradientReductions() const;
  // How many bytes this rank's all-gathers of parameters have received (ZeRO: stages 1 and 2 after
  // each applied step, stage 3 per unit around forward and backward; a bf16 run sends the parameters
  // its passes read as bf16 in bf16, docs/sharding.md; wholeParams() and checkpoints count too);
  // 0 without ZeRO.
  uint64_t gatheredBytes() const;
  // What this rank holds of the model's training state (parameters, gradients, optimizer state, the
  // collectives' staging), from the placement's own buffers: ZeRO's stages shrink it
  // (docs/sharding.md, "Memory per rank"). Where the ranks of a node share one copy it is that copy.
  StateBytes stateBytes() const;
  // Collective: every parameter, whole, in a fresh CPU tensor laid out as the ParamBuffer
  // (model.params.entries()' offsets): with ZeRO 3 gathered from the ranks' shards (PyTorch's
  // full_state_dict), otherwise a copy of the parameters.
  runtime::Tensor wholeParams();
  // Collective with ZeRO 3 (nothing otherwise): every parameter unit gathered whole into the model's
  // tensors while the returned guard lives, so that passes without the job's unit listener (an
  // evaluation split over the ranks, a program's own forward) read them (PyTorch FSDP's
  // summon_full_params); it costs the whole parameters' memory meanwhile. Destroy it before the
  // next training pass.
  class ParamsGathered {
   public:
    ~ParamsGathered();
    ParamsGathered(ParamsGathered&& other) noexcept : placement_(std::exchange(other.placement_, nullptr)) {}
    ParamsGathered(const ParamsGathered&) = delete;
    ParamsGathered& operator=(const ParamsGathered&) = delete;
    ParamsGathered& operator=(ParamsGathered&&) = delete;

   private:
    friend class Job;
    explicit ParamsGathered(Placement* placement);
    Placement* placement_;
  };
  [[nodiscard]] ParamsGathered gatherParams();
  // The GPU caching allocator's counters; nullopt on the CPU.
  std::optional<runtime::AllocatorStats> deviceMemoryStats() const;
  // Where this rank's time goes (train/observe/timeline.h): inactive until started (the Trainer starts it
  // for --trace and --step-report); step() and the strategies' barriers and all-reduces record
  // into it, a loop of one's own may record its own spans.
  Timeline& timeline() { return timeline_; }

 private:
  struct Token;
  void requirePlaced(const char* what) const;
  void requireSettled(const char* what) const;  // InvalidArgument while deferred results are pending
  // Runs `f`; when it throws, the collectives tell the ranks waiting for this one why first, and MPI
  // will not be finalised (collectives::markProcessFailing).
  template <class F>
  decltype(auto) failingTogether(F&& f);  // job.cc
  void checkPlaceable(const nn::Model& model, const nn::Optimizer& optimizer) const;
  Settings builtInSettings(const nn::Model& model, const nn::Optimizer& optimizer, const PlaceOptions& options) const;

  std::unique_ptr<Token> token_;  // first in, last out: one Job per process
  // This rank's slot in the node's roster of the job's processes (ipc/rank_roster.h), from the
  // constructor to after everything else: peers learn of its death before its first barrier, and
  // leaving it at the normal end marks it finished (not an early exit) for them and for cohortrun.
  struct Membership;
  std::unique_ptr<Membership> membership_;
  Timeline timeline_;  // before the placement, which records into it
  JobOptions options_;
  runtime::WorldInfo world_;
  runtime::Logger log_;
  runtime::Device device_;
  std::unique_ptr<runtime::cuda::GpuContext> gpu_;
  ResolvedPlacement choice_;  // resolved once, by the constructor
  nn::Model* model_ = nullptr;
  nn::Optimizer* optimizer_ = nullptr;
  std::unique_ptr<Placed> placed_;  // the placement and the job's collectives
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<StepGuard> guard_;  // measures and (GPU, deferred) judges the steps
  // The learning rates a deferred GPU step was queued with, oldest first (settleStep picks one).
  struct DeferredLr {
    int64_t settledSteps = 0;
    float ifSettled = 0, ifOneMore = 0;
    std::optional<double> loss;  // StepOptions::loss, for the spike history once the step settles
  };
  // The applied steps' losses and gradient norms, for StepOptions::skipSpikes (train/step.h, "Spikes").
  SpikeDetector lossHistory_, gradNormHistory_;
  void addToHistory(const StepResult& result, std::optional<double> loss);
  std::deque<DeferredLr> deferredLrs_;
  std::deque<StepResult> readyResults_;  // deferred steps on the CPU, already done
  int agreements_ = 0;                   // agree() calls so far: each has a segment of its own
  int microBatches_ = 1;                 // of the pass that synchronised last
  bool readyToStep_ = false;
};

}  // namespace cohort::train
