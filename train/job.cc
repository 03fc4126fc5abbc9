#include "train/job.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <sstream>

#include "collectives/communicator.h"
#include "ipc/rank_claim.h"
#include "ipc/rank_roster.h"
#include "runtime/device_query.h"
#include "runtime/digest.h"
#include "runtime/error.h"
#include "runtime/random.h"
#include "runtime/timeout.h"
#include "train/checkpoint/checkpointer.h"
#include "train/placement/placement_factory.h"
#include "train/placement/sharded_placement.h"
#include "train/settings_agreement.h"
#include "train/step/step_guard.h"
#include "train/step/step_pipeline.h"
#include "train/zero_memory.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/gpu_context.h"
#else
namespace cohort::runtime::cuda {
class GpuContext {};  // never made without CUDA; complete so that the Job's unique_ptr can be destroyed
}  // namespace cohort::runtime::cuda
#endif

namespace cohort::train {

namespace {

// One Job per process: its segments and communicators are named by the job, MPI is initialised
// once per process, and a second job would silently share or collide with them. The flag is the
// one piece of process-wide state, and only says whether a Job exists.
std::atomic<bool> gJobExists{false};

}  // namespace

// The claim on gJobExists, taken first and released last (also when a constructor throws).
struct Job::Token {
  Token() {
    if (gJobExists.exchange(true)) {
      COHORT_THROW(InvalidArgument) << "a train::Job already exists in this process: one process is one rank of one "
                                       "job (destroy the first Job before creating another)";
    }
  }
  ~Token() { gJobExists.store(false); }
  Token(const Token&) = delete;
  Token& operator=(const Token&) = delete;
};

// The claim on the rank (a second job of the same id is refused here, for the whole run) and on its
// roster slot; the slot is left finished only when the Job ends normally, not while an exception
// unwinds it.
struct Job::Membership {
  explicit Membership(const runtime::WorldInfo& world)
      : claim(ipc::RankClaim::take(world.jobId, world.rank, optionsFor(world).jobIdSource)),
        roster(ipc::RankRoster::join(optionsFor(world))) {}
  ~Membership() { roster.leave(std::uncaught_exceptions() == 0); }
  static ipc::RankRoster::JoinOptions optionsFor(const runtime::WorldInfo& w) {
    return {.jobId = w.jobId,
            .rank = w.rank,
            .localRank = w.localRank,
            .localWorldSize = w.localWorldSize,
            .jobIdSource = w.source == "cohortrun" ? "COHORT_JOB_ID=" + w.jobId : ""};
  }
  ipc::RankClaim claim;
  ipc::RankRoster roster;
};

namespace {

void validate(const JobOptions& o, const runtime::WorldInfo& world) {
  const std::string mode = toString(o.mode);
  if (o.mode == Mode::kLocal && !world.isSingle()) {
    COHORT_THROW(InvalidArgument) << "mode local trains in one process, but this process is rank " << world.rank
                                  << " of " << world.worldSize << " (from " << world.source
                                  << " variables): use mode allreduce or hogwild";
  }
  if (o.averageEvery < 0)
    COHORT_THROW(InvalidArgument) << "averageEvery must be >= 0 steps (0: the default), got " << o.averageEvery;
  if (o.averageEvery > 0 && o.mode != Mode::kHogwild) {
    COHORT_THROW(InvalidArgument) << "averageEvery applies to mode hogwild only, not " << mode;
  }
  if (o.timeout.count() <= 0) COHORT_THROW(InvalidArgument) << "the job's timeout must be positive";
  const bool onGpu = runtime::Device::parse(o.device).isCuda();
  if (!onGpu && o.tf32)
    COHORT_THROW(InvalidArgument) << "tf32 applies to GPUs (the CPU's matrix products are plain fp32)";
  if (!onGpu && o.precision != runtime::DType::kF32) {
    COHORT_THROW(InvalidArgument) << "precision " << runtime::dtypeName(o.precision)
                                  << " needs a GPU (on the CPU every pass computes in fp32): train on device cuda";
  }
  if (onGpu && o.mode == Mode::kHogwild && world.spansNodes()) {
    COHORT_THROW(InvalidArgument)
        << "mode hogwild across nodes averages the nodes' copies on the CPU, but this job has " << world.worldSize
        << " ranks with " << world.localWorldSize
        << " on this node: train on device cpu, or use mode allreduce on GPUs";
  }
}

}  // namespace

ResolvedPlacement resolvePlacement(const JobOptions& options, const runtime::WorldInfo& world) {
  return resolvePlacement({.mode = options.mode,
                           .backend = options.backend,
                           .paramCopies = options.paramCopies,
                           .zero = options.zero,
                           .zeroScope = options.zeroScope},
                          world, runtime::Device::parse(options.device).isCuda());
}

Job::Job(const JobOptions& options) : Job(options, runtime::WorldInfo::detect()) {}

Job::Job(const JobOptions& options, const runtime::WorldInfo& world)
    : token_(std::make_unique<Token>()), options_(options), world_(world), log_(world_, {.fd = 1}) {
  validate(options_, world_);
  // An unknown backend, or one this build or world lacks, fails here rather than at place().
  choice_ = resolvePlacement(options_, world_);
  options_.timeout = runtime::saturateTimeout(options_.timeout);  // deadlines are now + timeout
  if (!world_.isSingle()) membership_ = std::make_unique<Membership>(world_);
  // One worker per GPU: "cuda" is the GPU of this worker's local rank.
  device_ = runtime::selectDevice(options_.device, world_.localRank);
#ifdef COHORT_HAVE_CUDA
  if (device_.isCuda()) {
    gpu_ = std::make_unique<runtime::cuda::GpuContext>(
        device_, runtime::GpuOptions{.conv = {.algorithms = options_.convAlgorithms, .tf32 = options_.tf32},
                                     .tf32 = options_.tf32,
                                     .tuneGemms = options_.gemmTuning});
    if (!gpu_->tunesGemms() && world_.rank == 0) {
      log_.info() << "GEMM tuning off ("
                  << (options_.gemmTuning ? "--gemm-tuning off" : "COHORT_GEMM_TUNING")
                  << "): every product takes cuBLASLt's heuristic's first algorithm";
    }
  }
#endif
}

Job::~Job() {
  // The placement (segments, communicator, device share) goes before the GPU context it may use.
  checkpointer_.reset();
  guard_.reset();
  placed_.reset();
  gpu_.reset();
}

runtime::cuda::GpuContext* Job::gpu() const { return gpu_.get(); }

std::string Job::backend() const { return placed_ ? placed_->backend : choice_.backendName(); }

bool Job::replicas() const { return placed_ ? placed_->replicas : choice_.replicas(); }

int64_t Job::averageEvery() const {
  if (options_.mode != Mode::kHogwild || !world_.spansNodes()) return 0;
  return options_.averageEvery > 0 ? options_.averageEvery : kDefaultAverageEvery;
}

void Job::checkPlaceable(const nn::Model& model, const nn::Optimizer& optimizer) const {
  if (placed_) {
    COHORT_THROW(InvalidArgument) << "this job already placed the parameters of model '" << model_->name
                                  << "': a Job trains one model, placed once";
  }
  if (model.params.bound()) {
    COHORT_THROW(InvalidArgument)
        << "model '" << model.name
        << "' is already bound: give place() a model whose "
           "parameters are registered but not allocated (the job puts them where its mode needs them)";
  }
  if (optimizer.sharded()) {
    if (choice_.kind != PlacementKind::kSharded) {
      COHORT_THROW(InvalidArgument) << "the optimizer was made over a shard map, but this job keeps whole replicas (no "
                                       "ZeRO stage): make it with job.makeOptimizer(options, model)";
    }
  } else if (optimizer.numel() != model.params.numel()) {
    COHORT_THROW(InvalidArgument) << "the optimizer was made for " << optimizer.numel() << " parameters, but model '"
                                  << model.name << "' has " << model.params.numel()
                                  << ": make it with makeOptimizer(options, model.params.numel(), job.gpu())";
  }
  if (optimizer.device() != device_) {
    COHORT_THROW(InvalidArgument) << "the optimizer keeps its state on " << optimizer.device().str()
                                  << " but the job trains on " << device_.str()
                                  << ": make it with makeOptimizer(options, numel, job.gpu())";
  }
  if (options_.precision != runtime::DType::kF32 && !model.net->takesBf16()) {
    COHORT_THROW(InvalidArgument) << "model '" << model.name << "' does not implement "
                                  << runtime::dtypeName(options_.precision)
                                  << " passes yet (its layers compute in fp32 only): "
                                  << "train it in fp32 (docs/gpu.md, \"Precision\", lists the models that take bf16)";
  }
}

// The choice was resolved by the constructor; the ranks agree on it (with everything else) before
// the one factory makes exactly it.
void Job::place(nn::Model& model, nn::Optimizer& optimizer, const PlaceOptions& o) {
  checkPlaceable(model, optimizer);
  agree(builtInSettings(model, optimizer, o));
  // A sharded job on the CPU never allocates the whole gradient beside the whole parameters it
  // initialises (on a GPU, stage 1 keeps it there; the placement drops it at stages 2 and 3).
  if (choice_.kind == PlacementKind::kSharded && !gpu_) {
    model.params.allocateValues(runtime::cpuAllocator());
  } else {
    model.params.allocate(runtime::cpuAllocator());
  }
  PlacementContext context{.params = model.params,
                           .optimizer = optimizer,
                           .world = world_,
                           .timeout = options_.timeout,
                           .gpu = gpu_.get(),
                           .initialise =
                               [&] {
                                 if (o.initialise) {
                                   o.initialise(model);
                                 } else {
                                   runtime::Rng rng(runtime::mix(o.seed, 0x696e6974ull /* "init" */));
                                   model.net->resetParams(rng);
                                 }
                               },
                           .timeline = timeline_,
                           .testHooks = options_.testHooks};
  placed_ =
      std::make_unique<Placed>(makePlacement(choice_, context,
                                    {.zeroPrefetch = options_.zeroPrefetch,
                                     .averageEvery = std::max<int64_t>(averageEvery(), 1),
                                     .precision = options_.precision}));
  model_ = &model;
  optimizer_ = &optimizer;
  guard_ = std::make_unique<StepGuard>(gpu_.get(), options_.timeout);
  checkpointer_ = std::make_unique<Checkpointer>(Checkpointer::Context{.placement = *placed_->placement,
                                                                       .collectives = *placed_->collectives,
                                                                       .model = model,
                                                                       .optimizer = optimizer,
                                                                       .world = world_,
                                                                       .gpu = gpu_.get(),
                                                                       .mode = toString(options_.mode),
                                                                       .sharded = dynamic_cast<ShardedPlacement*>(
                                                                           placed_->placement.get()),
                                                                       .timeout = options_.timeout});
}

StateBytes Job::stateBytes() const {
  requirePlaced("Job::stateBytes()");
  if (std::optional<StateBytes> own = placed_->placement->stateBytes()) return *own;
  return {.params = model_->params.bytes(),
          .grads = model_->params.bytes(),
          .optimizer = optimizer_->stateFloats() * sizeof(float)};
}

std::unique_ptr<nn::Optimizer> Job::makeOptimizer(const nn::OptimizerOptions& options, const nn::Model& model) const {
  if (choice_.kind != PlacementKind::kSharded) return nn::makeOptimizer(options, model.params.numel(), gpu_.get());
  const int group = shardGroupSize(world_, choice_.zeroScope);
  const int rank = choice_.zeroScope == ZeroScope::kNode && world_.spansNodes() ? world_.localRank : world_.rank;
  return nn::makeShardOptimizer(options, nn::shardMapOf(model.params, {.worldSize = group, .rank = rank}), gpu_.get());
}

Settings Job::builtInSettings(const nn::Model& model, const nn::Optimizer& optimizer, const PlaceOptions& o) const {
  // The layout as text, digested: two models of one name and size whose parameters are shaped
  // otherwise would place their shards and checkpoints wrongly.
  std::ostringstream layout;
  for (const auto& e : model.params.entries()) layout << e.name << e.shape.str() << ';';
  for (const auto& e : model.params.bufferEntries()) layout << e.name << e.shape.str() << ';';
  const nn::OptimizerOptions& opt = optimizer.options();
  Settings s = {{"mode", toString(options_.mode)},
                {"backend", backend()},
                {"replicas", replicas() ? "yes" : "no"},
                {"uneven_nodes", toString(choice_.unevenNodes)},
                {"zero", std::to_string(choice_.zero)},
                {"zero_scope", toString(choice_.zeroScope)},
                {"zero_prefetch", options_.zeroPrefetch ? "yes" : "no"},
                {"device", device_.isCuda() ? "cuda" : "cpu"},
                {"world_size", std::to_string(world_.worldSize)},
                {"model", model.name},
                {"parameters", std::to_string(model.params.numel())},
                {"parameter_layout", runtime::Digest().add(layout.str()).hex()},
                {"optimizer", optimizer.name()},
                {"lr", settingValue(opt.lr)},
                {"momentum", settingValue(opt.momentum)},
                {"nesterov", opt.nesterov ? "yes" : "no"},
                {"weight_decay", settingValue(opt.weightDecay)},
                {"betas", settingValue(opt.beta1) + "," + settingValue(opt.beta2)},
                {"eps", settingValue(opt.eps)},
                {"init", o.initialise ? "the program's own" : "seed " + std::to_string(o.seed)},
                {"average_every", std::to_string(averageEvery())},
                {"conv_algorithms", runtime::toString(options_.convAlgorithms)},
                {"tf32", options_.tf32 ? "yes" : "no"},
                {"precision", runtime::dtypeName(options_.precision)}};
  s.insert(s.end(), o.settings.begin(), o.settings.end());
  return s;
}

void Job::agree(const Settings& settings) {
  if (world_.isSingle()) return;
  agreeOnSettings(settings, {.world = world_,
                             .timeout = options_.timeout,
                             .name = "settings-" + std::to_string(agreements_++),
                             .roster = membership_ ? &membership_->roster : nullptr});
}

void Job::requirePlaced(const char* what) const {
  if (!placed_) COHORT_THROW(InvalidArgument) << what << " needs the model placed first: call Job::place()";
}

void Job::requireSettled(const char* what) const {
  if (pendingSteps() > 0) {
    COHORT_THROW(InvalidArgument) << what << " with " << pendingSteps()
                                  << " deferred step result(s) pending: take them with settleStep() first";
  }
}

nn::Model& Job::model() const {
  requirePlaced("Job::model()");
  return *model_;
}

nn::Optimizer& Job::optimizer() const {
  requirePlaced("Job::optimizer()");
  return *optimizer_;
}

nn::Pass Job::pass(const PassOptions& o) {
  requirePlaced("Job::pass()");
  if (o.microBatches < 1 || o.microBatch < 0 || o.microBatch >= o.microBatches) {
    COHORT_THROW(InvalidArgument) << "micro-batch " << o.microBatch << " of " << o.microBatches
                                  << ": expected 0 <= microBatch < microBatches";
  }
  const bool last = o.microBatch + 1 == o.microBatches;
  nn::Pass pass;
  pass.training = true;
  pass.needInputGrad = false;
  pass.accumulateGrads = o.microBatch > 0;
  pass.rng = o.rng;
  Placement& placement = *placed_->placement;
  pass.units = last || placement.listensEveryMicroBatch() ? placement.unitListener() : nullptr;
  placement.beginPass(o.microBatch, o.microBatches);
  pass.gpu = gpu_.get();
  pass.precision = options_.precision;
  if (last) microBatches_ = o.microBatches;
  readyToStep_ = last;
  return pass;
}

nn::Pass Job::evalPass() const {
  nn::Pass pass;
  pass.training = false;
  pass.needInputGrad = false;
  pass.gpu = gpu_.get();
  pass.precision = options_.precision;
  return pass;
}

template <class F>
decltype(auto) Job::failingTogether(F&& f) {
  try {
    return f();
  } catch (const Error& error) {
    placed_->collectives->abandon(error);
    collectives::markProcessFailing();
    throw;
  }
}

StepResult Job::step(const StepOptions& options) {
  requirePlaced("Job::step()");
  if (!readyToStep_) {
    COHORT_THROW(InvalidArgument) << "Job::step() before the backward of the last micro-batch: step after "
                                     "pass({.microBatch = K - 1, .microBatches = K})";
  }
  if (!(options.skipSpikes >= 0) || !std::isfinite(options.skipSpikes)) {
    COHORT_THROW(InvalidArgument) << "skipSpikes must be a finite number >= 0 (0: off), got " << options.skipSpikes;
  }
  if (!(options.clipGradNorm >= 0) || !std::isfinite(options.clipGradNorm)) {
    COHORT_THROW(InvalidArgument) << "clipGradNorm must be a finite number >= 0 (0: no clipping), got "
                                  << options.clipGradNorm;
  }
  // A split gradient (ZeRO) is judged on the host: its step is synchronous, its result ready.
  const bool defer = options.deferResult && gpu_ && !placed_->placement->splitsGradient();
  if (pendingSteps() > (options.deferResult ? 1u : 0u)) {
    COHORT_THROW(InvalidArgument) << "Job::step() with " << pendingSteps() << " deferred result(s) pending: take them "
                                  << "with settleStep() first (a deferred step may follow at most one, a "
                                     "synchronous step none)";
  }
  readyToStep_ = false;
  // The learning rate for either outcome of the step still pending (a deferred step only).
  const int64_t settled = optimizer_->steps();
  float lrIfSettled = optimizer_->options().lr, lrIfOneMore = lrIfSettled;
  if (options.lrAt) {
    lrIfSettled = options.lrAt(settled);
    lrIfOneMore = defer ? options.lrAt(settled + 1) : lrIfSettled;
    if (!defer) optimizer_->setLr(lrIfSettled);
  }
  const bool finiteLoss = !options.loss || std::isfinite(*options.loss);
  const double z = options.skipSpikes;
  Timeline::Scope span(timeline_, SpanKind::kStep);
  timeline_.addStep();
  StepResult result = failingTogether([&] {
    return runStep(*placed_->placement,
                   {.gradScale = 1.0f / static_cast<float>(microBatches_),
                    .clipGradNorm = options.clipGradNorm,
                    .loss = {.finite = finiteLoss,
                             .spike = z > 0 && options.loss && finiteLoss && *options.loss > lossHistory_.limit(z)},
                    .exchangeLoss = options.loss.has_value() && world_.worldSize > 1,
                    .maxGradNorm = z > 0 ? gradNormHistory_.limit(z) : std::numeric_limits<double>::infinity(),
                    .guard = guard_.get(),
                    .defer = defer,
                    .skipsLeft = options.skipNonFinite,
                    .lrIfSettled = lrIfSettled,
                    .lrIfOneMore = lrIfOneMore,
                    .graph = defer ? options.graph : nullptr},
                   {.rank = world_.rank, .worldSize = world_.worldSize, .timeline = timeline_});
  });
  if (defer) {
    deferredLrs_.push_back(
        {.settledSteps = settled, .ifSettled = lrIfSettled, .ifOneMore = lrIfOneMore, .loss = options.loss});
    return result;
  }
  addToHistory(result, options.loss);
  if (options.deferResult) {
    readyResults_.push_back(result);
    result = StepResult{.pending = true};
  }
  return result;
}

std::optional<StepResult> Job::settleStep() {
  requirePlaced("Job::settleStep()");
  if (!readyResults_.empty()) {
    const StepResult result = readyResults_.front();
    readyResults_.pop_front();
    return result;
  }
  if (deferredLrs_.empty()) return std::nullopt;
  const StepGuard::Settled settled = failingTogether([&] { return guard_->settle(); });
  const DeferredLr lr = deferredLrs_.front();
  deferredLrs_.pop_front();
  optimizer_->setSteps(settled.appliedSteps);
  optimizer_->setLr(settled.appliedBefore == lr.settledSteps ? lr.ifSettled : lr.ifOneMore);
  addToHistory(settled.result, lr.loss);
  return settled.result;
}

// Only applied steps make the history: a spike stays out of the statistics it was judged against.
void Job::addToHistory(const StepResult& result, std::optional<double> loss) {
  if (!result.applied) return;
  if (loss) lossHistory_.add(*loss);
  gradNormHistory_.add(result.gradNorm);
}

size_t Job::pendingSteps() const { return readyResults_.size() + deferredLrs_.size(); }

bool Job::lockstep() const {
  requirePlaced("Job::lockstep()");
  return placed_->collectives->lockstep();
}

bool Job::sharedParams() const {
  requirePlaced("Job::sharedParams()");
  return placed_->placement->sharedParams();
}

bool Job::trustHalfCopy(bool trust) {
  requirePlaced("Job::trustHalfCopy()");
  nn::ParamBuffer& params = model_->params;
  nn::Optimizer& optimizer = this->optimizer();
  params.trustHalfCopy(false);
  if (optimizer.halfCopy()) optimizer.setHalfCopy(nullptr);
#ifdef COHORT_HAVE_CUDA
  if (!trust || options_.precision != runtime::DType::kBF16 || !gpu_ || !params.readsAnyAsBf16() ||
      !placed_->placement->keepsHalfCopy()) {
    return false;
  }
  params.makeHalfCopy(gpu_->allocator());
  params.refreshHalfCopy(gpu_->stream());
  // The optimizer's step writes the copy with the values from here on (nn/optimizer.h).
  optimizer.setHalfCopy(params.halfCopy());
  params.trustHalfCopy(true);
  return true;
#else
  (void)trust;
  return false;
#endif
}

void Job::barrier(const std::string& what) {
  requirePlaced("Job::barrier()");
  failingTogether([&] { placed_->collectives->barrier(what); });
}

void Job::reduce(std::span<double> values, Reduce op) {
  requirePlaced("Job::reduce()");
  const ScalarOp scalarOp = op == Reduce::kMax    ? ScalarOp::kMax
                            : op == Reduce::kMean ? ScalarOp::kMean
                                                  : ScalarOp::kSum;
  failingTogether([&] { placed_->collectives->reduce(values, scalarOp); });
}

double Job::mean(double value) {
  reduce({&value, 1}, Reduce::kMean);
  return value;
}

bool Job::any(bool mine) {
  double v = mine ? 1.0 : 0.0;
  reduce({&v, 1}, Reduce::kMax);
  return v != 0.0;
}

Job::ParamsGathered::ParamsGathered(Placement* placement) : placement_(placement) {
  if (placement_) placement_->gatherAllParams();
}

Job::ParamsGathered::~ParamsGathered() {
  if (placement_) placement_->releaseGatheredParams();
}

Job::ParamsGathered Job::gatherParams() {
  requirePlaced("Job::gatherParams()");
  return failingTogether([&] { return ParamsGathered(placed_->placement.get()); });
}

runtime::Tensor Job::wholeParams() {
  requirePlaced("Job::wholeParams()");
  if (std::optional<runtime::Tensor> gathered = failingTogether([&] { return placed_->placement->gatherWholeParams(); })) {
    return std::move(*gathered);
  }
  runtime::Tensor whole = runtime::Tensor::zeros({static_cast<int64_t>(model_->params.numel())});
  whole.copyFrom(model_->params.values());
  return whole;
}

void Job::save(const std::string& path, const nn::Metadata& extra, const SaveOptions& options) {
  requirePlaced("Job::save()");
  requireSettled("Job::save()");
  checkpointer_->save(path, extra, options);
}

std::optional<CheckpointCommit> Job::settleCheckpoint(const SettleOptions& options) {
  requirePlaced("Job::settleCheckpoint()");
  return checkpointer_->settle(options);
}

bool Job::checkpointInFlight() const { return checkpointer_ && checkpointer_->inFlight(); }

std::optional<nn::Metadata> Job::load(const std::string& path, const nn::Metadata& mustMatch) {
  requirePlaced("Job::load()");
  requireSettled("Job::load()");
  std::optional<nn::Metadata> meta = checkpointer_->load(path, mustMatch);
#ifdef COHORT_HAVE_CUDA
  if (model_->params.halfCopyTrusted()) model_->params.refreshHalfCopy(gpu_->stream());  // the values loaded
#endif
  return meta;
}

runtime::data::DataLoaderOptions Job::dataSplit(runtime::data::DataLoaderOptions options) const {
  options.rank = world_.rank;
  options.worldSize = world_.worldSize;
  return options;
}

void Job::checkPeers(std::chrono::milliseconds settle) {
  if (placed_) placed_->collectives->checkPeers(settle);
}

uint64_t Job::gradientReductions() const { return placed_ ? placed_->placement->gradientReductions() : 0; }

uint64_t Job::gatheredBytes() const { return placed_ ? placed_->placement->gatheredBytes() : 0; }

std::optional<runtime::AllocatorStats> Job::deviceMemoryStats() const {
#ifdef COHORT_HAVE_CUDA
  if (gpu_) return gpu_->allocator().stats();
#endif
  return std::nullopt;
}

}  // namespace cohort::train
