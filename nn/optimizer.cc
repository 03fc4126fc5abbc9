#include "nn/optimizer.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "nn/gpu_dispatch.h"
#include "nn/param_buffer.h"
#include "runtime/cpu/blas.h"
#include "runtime/error.h"
#include "runtime/prefetch.h"

namespace cohort::nn {
namespace {

using runtime::Shape;

#ifdef COHORT_HAVE_CUDA
// Writes a step's options for every rate (Optimizer::rates_) into the optimizer's device arguments
// (one kernel, uncaptured): `options(steps, rate, lr)` for the settled count at lrIfSettled and for
// one more at lrIfOneMore (`step`: an Optimizer::GpuStep).
// One store per block of kOptimizerRatesPerBlock rates (one for the usual two).
template <class Options, class Step, class MakeOptions>
void storeStepArgs(void* device, const Step& step, const std::vector<ParamGroup>& rates, MakeOptions options,
                   const runtime::Stream& stream) {
  constexpr size_t kPerBlock = runtime::cuda::kOptimizerRatesPerBlock;
  auto* blocks = static_cast<runtime::cuda::OptimizerStepArgs<Options>*>(device);
  for (size_t first = 0; first < std::max<size_t>(rates.size(), 1); first += kPerBlock) {
    runtime::cuda::OptimizerStepArgs<Options> args{.settledSteps = step.settledSteps};
    for (size_t r = first; r < std::min(rates.size(), first + kPerBlock); ++r) {
      args.ifSettled[r - first] = options(step.settledSteps, rates[r], step.lrIfSettled);
      args.ifOneMore[r - first] = options(step.settledSteps + 1, rates[r], step.lrIfOneMore);
    }
    runtime::cuda::storeOnDevice(blocks + first / kPerBlock, args, stream);
  }
}
#endif

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerOptions& o, size_t numel, runtime::cuda::GpuContext* gpu) : Optimizer(o, numel, gpu) {
    if (o.momentum != 0.0f) buf_ = zeroState(numel);
  }
  std::string name() const override { return "sgd"; }

  void stepRange(float* __restrict p, const float* __restrict g, int64_t stateBegin, int64_t n,
                 const RunRate& rate) override {
    const float lr = rate.lr, wd = rate.weightDecay, m = options_.momentum;
    if (m == 0.0f) {
      for (int64_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
      return;
    }
    float* __restrict b = buf_.data() + stateBegin;
    const bool first = steps_ == 0;
    const bool nesterov = options_.nesterov;
    for (int64_t i = 0; i < n; ++i) {
      float d = g[i] + wd * p[i];
      float bi = first ? d : m * b[i] + d;
      b[i] = bi;
      p[i] -= lr * (nesterov ? d + m * bi : bi);
    }
  }

#ifdef COHORT_HAVE_CUDA
  runtime::cuda::SgdStepOptions gpuOptions(int64_t steps, const RunRate& rate) const {
    return {.lr = rate.lr, .momentum = options_.momentum, .weightDecay = rate.weightDecay,
            .nesterov = options_.nesterov, .firstStep = steps == 0};
  }
  runtime::cuda::SgdBuffers gpuBuffers(float* p, const float* g, int64_t stateBegin, int64_t n) {
    const auto count = static_cast<size_t>(n);
    return {.param = {p, count},
            .grad = {g, count},
            .momentumBuffer = buf_.defined() ? std::span<float>(buf_.data() + stateBegin, count) : std::span<float>()};
  }
#endif
  void stepGpuRange(float* p, const float* g, int64_t stateBegin, int64_t n, const RunRate& rate) override {
#ifdef COHORT_HAVE_CUDA
    runtime::cuda::sgdStep(gpuBuffers(p, g, stateBegin, n), gpuOptions(steps_, rate), gpu_->stream());
#else
    (void)p, (void)g, (void)stateBegin, (void)n, (void)rate;
#endif
  }
  void stageGpu(const GpuStep& step) override {
#ifdef COHORT_HAVE_CUDA
    const auto options = [&](int64_t steps, const ParamGroup& rate, float lr) { return gpuOptions(steps, rateOf(rate, lr)); };
    storeStepArgs<runtime::cuda::SgdStepOptions, GpuStep>(stepArgs_.data(), step, rates_, options, gpu_->stream());
#else
    (void)step;
#endif
  }
  void applyGpu(float* p, const float* g, const runtime::cuda::StepControl* control) override {
#ifdef COHORT_HAVE_CUDA
    runtime::cuda::sgdStep({.param = p, .grad = g, .momentumBuffer = buf_.defined() ? buf_.data() : nullptr,
                            .half = half_, .chunks = chunks(), .chunkCount = chunkCount_},
                           static_cast<const runtime::cuda::OptimizerStepArgs<runtime::cuda::SgdStepOptions>*>(
                               static_cast<const void*>(stepArgs_.data())),
                           control, gpu_->stream());
#else
    (void)p, (void)g, (void)control;
#endif
  }
  std::vector<StateTensor> state() const override {
    if (!buf_.defined()) return {};
    return {{"momentum_buffer", buf_}};
  }
  std::vector<Tensor*> stateTensors() override {
    if (!buf_.defined()) return {};
    return {&buf_};
  }

 private:
  Tensor buf_;
};

class Adam final : public Optimizer {
 public:
  Adam(const OptimizerOptions& o, size_t numel, bool decoupled, runtime::cuda::GpuContext* gpu)
      : Optimizer(o, numel, gpu), decoupled_(decoupled) {
    expAvg_ = zeroState(numel);
    expAvgSq_ = zeroState(numel);
  }
  std::string name() const override { return decoupled_ ? "adamw" : "adam"; }

  // The bias corrections of the step after `steps` applied ones, at learning rate `lr`, in double
  // as PyTorch computes them, rounded to float once.
  void biasCorrections(int64_t steps, float lr, float& stepSize, float& bc2Sqrt) const {
    const double t = static_cast<double>(steps + 1);
    stepSize = static_cast<float>(lr / (1.0 - std::pow(static_cast<double>(options_.beta1), t)));
    bc2Sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(options_.beta2), t)));
  }

  void beginStep() override {
    const double t = static_cast<double>(steps_ + 1);
    bc1_ = 1.0 - std::pow(static_cast<double>(options_.beta1), t);
    bc2Sqrt_ = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(options_.beta2), t)));
  }

  void stepRange(float* __restrict p, const float* __restrict g, int64_t stateBegin, int64_t n,
                 const RunRate& rate) override {
    float* __restrict m = expAvg_.data() + stateBegin;
    float* __restrict v = expAvgSq_.data() + stateBegin;
    const float lr = rate.lr, b1 = options_.beta1, b2 = options_.beta2, eps = options_.eps;
    const float wd = rate.weightDecay;
    const float decay = decoupled_ ? 1.0f - lr * wd : 1.0f;
    const float coupledWd = decoupled_ ? 0.0f : wd;
    const float stepSize = static_cast<float>(lr / bc1_), bc2Sqrt = bc2Sqrt_;
    for (int64_t i = 0; i < n; ++i) {
      float pi = p[i] * decay;
      float gi = g[i] + coupledWd * pi;
      float mi = b1 * m[i] + (1.0f - b1) * gi;
      float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] = pi - stepSize * mi / (std::sqrt(vi) / bc2Sqrt + eps);
    }
  }

#ifdef COHORT_HAVE_CUDA
  runtime::cuda::AdamStepOptions gpuOptions(int64_t steps, const RunRate& rate) const {
    const float lr = rate.lr, wd = rate.weightDecay;
    runtime::cuda::AdamStepOptions o{.beta1 = options_.beta1, .beta2 = options_.beta2, .eps = options_.eps,
                                     .decay = decoupled_ ? 1.0f - lr * wd : 1.0f,
                                     .coupledWeightDecay = decoupled_ ? 0.0f : wd};
    biasCorrections(steps, lr, o.stepSize, o.bc2Sqrt);
    return o;
  }
#endif
  void stepGpuRange(float* p, const float* g, int64_t stateBegin, int64_t n, const RunRate& rate) override {
#ifdef COHORT_HAVE_CUDA
    runtime::cuda::adamStep(p, g, expAvg_.data() + stateBegin, expAvgSq_.data() + stateBegin, n,
                            gpuOptions(steps_, rate), gpu_->stream());
#else
    (void)p, (void)g, (void)stateBegin, (void)n, (void)rate;
#endif
  }
  void stageGpu(const GpuStep& step) override {
#ifdef COHORT_HAVE_CUDA
    const auto options = [&](int64_t steps, const ParamGroup& rate, float lr) { return gpuOptions(steps, rateOf(rate, lr)); };
    storeStepArgs<runtime::cuda::AdamStepOptions, GpuStep>(stepArgs_.data(), step, rates_, options, gpu_->stream());
#else
    (void)step;
#endif
  }
  void applyGpu(float* p, const float* g, const runtime::cuda::StepControl* control) override {
#ifdef COHORT_HAVE_CUDA
    runtime::cuda::adamStep({.param = p, .grad = g, .expAvg = expAvg_.data(), .expAvgSq = expAvgSq_.data(),
                             .half = half_, .chunks = chunks(), .chunkCount = chunkCount_},
                            static_cast<const runtime::cuda::OptimizerStepArgs<runtime::cuda::AdamStepOptions>*>(
                                static_cast<const void*>(stepArgs_.data())),
                            control, gpu_->stream());
#else
    (void)p, (void)g, (void)control;
#endif
  }
  std::vector<StateTensor> state() const override { return {{"exp_avg", expAvg_}, {"exp_avg_sq", expAvgSq_}}; }
  std::vector<Tensor*> stateTensors() override { return {&expAvg_, &expAvgSq_}; }

 private:
  bool decoupled_;
  Tensor expAvg_, expAvgSq_;
  double bc1_ = 1;    // this step's bias corrections: 1 − β1ᵗ (the step size is lr / bc1_, rounded once)
  float bc2Sqrt_ = 1;  // and sqrt(1 − β2ᵗ)
};

}  // namespace

Tensor Optimizer::zeroState(size_t numel) const {
  const Shape shape{static_cast<int64_t>(numel)};
#ifdef COHORT_HAVE_CUDA
  if (gpu_) {
    Tensor t = Tensor::empty(shape, gpu_->allocator());
    runtime::cuda::fill({t.data(), numel}, 0.0f, gpu_->stream());
    return t;
  }
#endif
  return Tensor::zeros(shape);
}

void Optimizer::requireGpuBuffers(const Tensor& params, const Tensor& grads) const {
#ifdef COHORT_HAVE_CUDA
  const bool sameDevice = gpu_ && params.device() == gpu_->device() && grads.device() == params.device();
#else
  const bool sameDevice = false;
#endif
  if (!sameDevice) {
    COHORT_THROW(InvalidArgument) << name() << " steps buffers on " << params.device().str() << " and "
                                  << grads.device().str() << " but its state is on " << (gpu_ ? "a GPU" : "the CPU")
                                  << "; make the optimizer for that device";
  }
}

void Optimizer::makeRuns() {
  size_t at = 0;
  const float wd = options_.weightDecay;
  std::vector<ParamGroup> runs;
  auto add = [&runs](ParamGroup run) {
    if (run.begin == run.end) return;
    if (!runs.empty() && runs.back().weightDecay == run.weightDecay && runs.back().lrScale == run.lrScale) {
      runs.back().end = run.end;
    } else {
      runs.push_back(run);
    }
  };
  for (const ParamGroup& g : options_.groups) {
    add({.begin = at, .end = g.begin, .weightDecay = wd, .lrScale = 1.0f});
    add(g);
    at = g.end;
  }
  add({.begin = at, .end = SIZE_MAX, .weightDecay = wd, .lrScale = 1.0f});
  runs_ = std::move(runs);
  for (const ParamGroup& run : runs_) {
    const auto same = [&run](const ParamGroup& r) { return r.weightDecay == run.weightDecay && r.lrScale == run.lrScale; };
    if (std::none_of(rates_.begin(), rates_.end(), same)) rates_.push_back(run);
  }
}

void Optimizer::prepareGpu() {
#ifdef COHORT_HAVE_CUDA
  if (chunkTable_.defined()) return;
  using runtime::cuda::OptimizerChunk;
  std::vector<OptimizerChunk> table;
  forEachRun(0, static_cast<int64_t>(numel_), [&](int64_t offset, int64_t count, const ParamGroup& run) {
    const auto rate = std::find_if(rates_.begin(), rates_.end(), [&run](const ParamGroup& r) {
      return r.weightDecay == run.weightDecay && r.lrScale == run.lrScale;
    });
    for (int64_t at = 0; at < count; at += runtime::cuda::kOptimizerChunkElements) {
      table.push_back({.begin = offset + at,
                       .count = static_cast<int>(std::min<int64_t>(count - at, runtime::cuda::kOptimizerChunkElements)),
                       .rate = static_cast<int>(rate - rates_.begin())});
    }
  });
  const auto floatsFor = [](size_t bytes) { return Shape{static_cast<int64_t>((bytes + 3) / 4)}; };
  chunkTable_ = Tensor::empty(floatsFor(std::max<size_t>(1, table.size()) * sizeof(OptimizerChunk)), gpu_->allocator());
  runtime::cuda::copyToDevice(chunkTable_.data(), table.data(), table.size() * sizeof(OptimizerChunk), gpu_->stream());
  chunkCount_ = static_cast<int>(table.size());
  const size_t blocks = (std::max<size_t>(rates_.size(), 1) + runtime::cuda::kOptimizerRatesPerBlock - 1) /
                        runtime::cuda::kOptimizerRatesPerBlock;
  const size_t argsBytes = blocks * std::max(sizeof(runtime::cuda::OptimizerStepArgs<runtime::cuda::SgdStepOptions>),
                                             sizeof(runtime::cuda::OptimizerStepArgs<runtime::cuda::AdamStepOptions>));
  stepArgs_ = Tensor::empty(floatsFor(argsBytes), gpu_->allocator());
#endif
}

const runtime::cuda::OptimizerChunk* Optimizer::chunks() const {
  return static_cast<const runtime::cuda::OptimizerChunk*>(static_cast<const void*>(chunkTable_.data()));
}

void Optimizer::requireWholeGpuBuffers(const Tensor& params, const Tensor& grads) const {
  requireGpuBuffers(params, grads);
  if (static_cast<size_t>(params.numel()) != numel_ || static_cast<size_t>(grads.numel()) != numel_) {
    COHORT_THROW(InvalidArgument) << name() << " over " << numel_ << " elements was given parameters of "
                                  << params.numel() << " and gradients of " << grads.numel();
  }
}

void Optimizer::setHalfCopy(void* bf16Flat) {
  if (!gpu_ || sharded_) {
    COHORT_THROW(InvalidArgument) << name() << (gpu_ ? " steps a shard" : " steps on the CPU")
                                  << ": only a whole-buffer GPU optimizer keeps a bf16 copy of the parameters";
  }
  half_ = bf16Flat;
}

template <class Visit>
void Optimizer::forEachRun(int64_t flatBegin, int64_t n, Visit visit) const {
  const auto first = static_cast<size_t>(flatBegin), end = first + static_cast<size_t>(n);
  auto run = std::upper_bound(runs_.begin(), runs_.end(), first,
                              [](size_t at, const ParamGroup& r) { return at < r.begin; }) - 1;
  for (size_t at = first; at < end; ++run) {
    const size_t stop = std::min(end, run->end);
    visit(static_cast<int64_t>(at - first), static_cast<int64_t>(stop - at), *run);
    at = stop;
  }
}

Optimizer::RunRate Optimizer::rateOf(const ParamGroup& run, float lr) const {
  // lr · scale in double, as PyTorch's group lr is a Python float; the scale 1 leaves lr's bits.
  const float scaled = run.lrScale == 1.0f ? lr : static_cast<float>(static_cast<double>(lr) * run.lrScale);
  return {.lr = scaled, .weightDecay = run.weightDecay};
}

void Optimizer::update(float* params, const float* grads, int64_t stateBegin, int64_t flatBegin, int64_t n) {
  forEachRun(flatBegin, n, [&](int64_t offset, int64_t count, const ParamGroup& run) {
    const RunRate rate = rateOf(run, options_.lr);
    if (gpu_) {
      stepGpuRange(params + offset, grads + offset, stateBegin + offset, count, rate);
    } else {
      stepRange(params + offset, grads + offset, stateBegin + offset, count, rate);
    }
  });
}

void Optimizer::stepDeferred(const Tensor& params, const Tensor& grads, const DeferredStep& step) {
  COHORT_CHECK(step.control) << "a deferred step without its StepControl";
  stageDeferred(step);
  applyDeferred(params, grads, step.control);
}

void Optimizer::stageDeferred(const DeferredStep& step) {
  // The buffers are the whole model's (flat index = offset): a shard's would need its pieces' map.
  COHORT_CHECK(!sharded_ || runs_.size() == 1) << "a deferred step of a shard with parameter groups";
  COHORT_CHECK(gpu_) << "a deferred step of an optimizer on the CPU";
  prepareGpu();
  stageGpu({.settledSteps = steps_, .lrIfSettled = step.lrIfSettled, .lrIfOneMore = step.lrIfOneMore});
}

void Optimizer::applyDeferred(const Tensor& params, const Tensor& grads, const runtime::cuda::StepControl* control) {
  COHORT_CHECK(control) << "a deferred step without its StepControl";
  requireWholeGpuBuffers(params, grads);
  prepareGpu();  // made by an earlier stageDeferred (a graph captures this before the step's stage)
  applyGpu(params.data(), grads.data(), control);
}

void Optimizer::step(const Tensor& params, const Tensor& grads) {
  if (onGpu(params) || gpu_) {
    requireWholeGpuBuffers(params, grads);
    prepareGpu();
    stageGpu({.settledSteps = steps_, .lrIfSettled = options_.lr, .lrIfOneMore = options_.lr});
    applyGpu(params.data(), grads.data(), nullptr);
    ++steps_;
    return;
  }
  const int64_t n = params.numel();
  const int64_t start = std::min<int64_t>(static_cast<int64_t>(sweepStart_), n);
  beginStep();
  if (runtime::cpu::parallelChunks(n, runtime::cpu::kParallelGrain) > 1) {
    // Several threads (one process, --threads): each updates a chunk; every element's update is
    // its own, so the result is the same in any order.
    runtime::cpu::parallelRange(n, runtime::cpu::kParallelGrain, [&](int64_t first, int64_t last, int) {
      sweep(params.data(), grads.data(), first, last);
    });
  } else {
    sweep(params.data(), grads.data(), start, n);
    sweep(params.data(), grads.data(), 0, start);
  }
  ++steps_;
}

// Blocks of kSweepBlock elements; before updating one, ask for the next block's parameter lines in
// exclusive state (PREFETCHW). With Hogwild those lines were last written by another core, and
// fetching them one store at a time made the update 2.5 times slower than on private memory.
void Optimizer::sweep(float* params, const float* grads, int64_t begin, int64_t end, const BlockHook* prepareBlock,
                      int64_t flatShift) {
  constexpr int64_t kSweepBlock = 1024;
  for (int64_t b = begin; b < end; b += kSweepBlock) {
    const int64_t e = std::min(end, b + kSweepBlock);
    if (prepareBlock) (*prepareBlock)(b, e);
    runtime::prefetchRangeForWrite(params + e, static_cast<size_t>(std::min(end, e + kSweepBlock) - e) * sizeof(float));
    update(params + b, grads + b, b, b + flatShift, e - b);
  }
}

void Optimizer::stepSlice(const Tensor& params, const Tensor& grads, int64_t begin, int64_t end,
                          const BlockHook& prepareBlock) {
  COHORT_CHECK(!onGpu(params) && !gpu_) << "stepSlice runs on CPU buffers";
  COHORT_CHECK(0 <= begin && begin <= end && end <= params.numel() && grads.numel() == params.numel())
      << "slice [" << begin << ", " << end << ") of " << params.numel();
  beginStep();
  sweep(params.data(), grads.data(), begin, end, prepareBlock ? &prepareBlock : nullptr);
  ++steps_;
}

void Optimizer::stepShard(const Tensor& values, const Tensor& grads) {
  if (!sharded_) {
    COHORT_THROW(InvalidArgument) << name() << " was not made over a shard map: make it with makeShardOptimizer";
  }
  if (static_cast<size_t>(values.numel()) != numel_ || static_cast<size_t>(grads.numel()) != numel_) {
    COHORT_THROW(InvalidArgument) << name() << " over a shard of " << numel_ << " elements was given values of "
                                  << values.numel() << " and gradients of " << grads.numel();
  }
  if ((onGpu(values) || gpu_) && runs_.size() == 1) {
    step(values, grads);  // one group: the whole shard in one kernel, padding included
    return;
  }
  if (onGpu(values) || gpu_) requireGpuBuffers(values, grads);
  beginStep();
  for (const ShardMap::Piece& p : pieces_) {
    const auto begin = static_cast<int64_t>(p.shardOffset);
    const int64_t flatShift = static_cast<int64_t>(p.flatBegin) - begin;
    if (gpu_) {
      update(values.data() + begin, grads.data() + begin, begin, begin + flatShift, static_cast<int64_t>(p.realNumel()));
    } else {
      sweep(values.data(), grads.data(), begin, begin + static_cast<int64_t>(p.realNumel()), nullptr, flatShift);
    }
  }
  ++steps_;
}

void Optimizer::stepPieces(const PieceBuffers& b) {
  if (!sharded_) {
    COHORT_THROW(InvalidArgument) << name() << " was not made over a shard map: make it with makeShardOptimizer";
  }
  COHORT_CHECK(b.values && b.grads) << "stepPieces without buffers";
  beginStep();
  for (const ShardMap::Piece& p : pieces_) {
    const auto stateBegin = static_cast<int64_t>(p.shardOffset);
    float* values = b.values + (b.valuesPacked ? p.shardOffset : p.flatBegin);
    const float* grads = b.grads + (b.gradsPacked ? p.shardOffset : p.flatBegin);
    if (b.prepare) b.prepare(p);
    update(values, grads, stateBegin, static_cast<int64_t>(p.flatBegin), static_cast<int64_t>(p.realNumel()));
  }
  ++steps_;
}

void Optimizer::shardOver(const ShardMap& map) {
  if (steps_ != 0) {
    COHORT_THROW(InvalidArgument) << name() << " has taken " << steps_
                                  << " steps: only a fresh optimizer can be sharded (its state would be lost)";
  }
  if (half_) COHORT_THROW(InvalidArgument) << name() << " keeps a bf16 copy of the whole buffer: it cannot be sharded";
  chunkTable_ = stepArgs_ = Tensor();  // the table was the whole buffer's
  chunkCount_ = 0;
  // Every new tensor before the old ones go: a caching allocator would otherwise hand a shard the
  // whole state's block just freed (runtime/cuda/caching_allocator.h: blocks are never split).
  std::vector<Tensor> fresh;
  for (size_t i = 0; i < stateTensors().size(); ++i) fresh.push_back(zeroState(map.shardNumel()));
  for (size_t i = 0; Tensor* t : stateTensors()) *t = std::move(fresh[i++]);
  numel_ = map.shardNumel();
  sharded_ = true;
  pieces_ = map.pieces(map.rank());
}

runtime::Device Optimizer::device() const {
#ifdef COHORT_HAVE_CUDA
  if (gpu_) return gpu_->device();
#endif
  return runtime::Device::cpu();
}

size_t Optimizer::stateFloats() const {
  size_t n = 0;
  for (const auto& s : state()) n += static_cast<size_t>(s.tensor.numel());
  return n;
}

void Optimizer::placeState(float* memory) {
  COHORT_CHECK(!gpu_) << "placeState is for CPU optimizers";
  size_t used = 0;
  for (Tensor* t : stateTensors()) {
    const runtime::Shape shape = t->shape();
    const int64_t n = t->numel();
    *t = Tensor::view(memory + used, shape);
    used += static_cast<size_t>(n);
  }
}

OptimizerKind parseOptimizerKind(const std::string& name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adam") return OptimizerKind::kAdam;
  if (name == "adamw") return OptimizerKind::kAdamW;
  COHORT_THROW(InvalidArgument) << "unknown optimizer '" << name << "': expected sgd, adam or adamw";
}

namespace {

void validateGroups(const std::vector<ParamGroup>& groups, size_t flatNumel) {
  size_t at = 0;
  for (const ParamGroup& g : groups) {
    if (g.begin < at || g.begin >= g.end || g.end > flatNumel) {
      COHORT_THROW(InvalidArgument) << "parameter group [" << g.begin << ", " << g.end
                                    << ") is empty, overlaps the previous group or ends past the " << flatNumel
                                    << " parameters: groups must be sorted and disjoint";
    }
    if (!(g.weightDecay >= 0.0f) || !(g.lrScale > 0.0f) || !std::isfinite(g.lrScale)) {
      COHORT_THROW(InvalidArgument) << "parameter group [" << g.begin << ", " << g.end << ") has weight decay "
                                    << g.weightDecay << " and lr scale " << g.lrScale
                                    << ": the decay must be >= 0 and the scale positive";
    }
    at = g.end;
  }
}

// makeOptimizer's checks of everything but the groups, and the optimizer with state for `numel`.
std::unique_ptr<Optimizer> makeChecked(const OptimizerOptions& o, size_t numel, runtime::cuda::GpuContext* gpu) {
  if (!(o.lr > 0.0f) || !std::isfinite(o.lr)) COHORT_THROW(InvalidArgument) << "--lr must be positive, got " << o.lr;
  if (!(o.weightDecay >= 0.0f)) COHORT_THROW(InvalidArgument) << "--weight-decay must be >= 0, got " << o.weightDecay;
  switch (o.kind) {
    case OptimizerKind::kSgd:
      if (!(o.momentum >= 0.0f && o.momentum < 1.0f)) {
        COHORT_THROW(InvalidArgument) << "--momentum must be in [0, 1), got " << o.momentum;
      }
      if (o.nesterov && o.momentum == 0.0f) COHORT_THROW(InvalidArgument) << "nesterov needs a momentum above 0";
      return std::make_unique<Sgd>(o, numel, gpu);
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      if (!(o.beta1 >= 0.0f && o.beta1 < 1.0f && o.beta2 >= 0.0f && o.beta2 < 1.0f && o.eps > 0.0f)) {
        COHORT_THROW(InvalidArgument) << "adam needs betas (--betas) in [0, 1) and eps > 0, got betas " << o.beta1 << ","
                                      << o.beta2 << " and eps " << o.eps;
      }
      return std::make_unique<Adam>(o, numel, o.kind == OptimizerKind::kAdamW, gpu);
  }
  COHORT_THROW(InvalidArgument) << "unknown optimizer";
}

}  // namespace

std::vector<ParamGroup> decayMatricesOnly(const ParamBuffer& params, float weightDecay) {
  std::vector<ParamGroup> groups;
  for (const ParamBuffer::Entry& e : params.entries()) {
    if (e.numel == 0) continue;
    const float wd = e.shape.rank() >= 2 ? weightDecay : 0.0f;
    if (!groups.empty() && groups.back().end == e.offset && groups.back().weightDecay == wd) {
      groups.back().end = e.offset + e.numel;
    } else {
      groups.push_back({.begin = e.offset, .end = e.offset + e.numel, .weightDecay = wd});
    }
  }
  return groups;
}

std::unique_ptr<Optimizer> makeShardOptimizer(const OptimizerOptions& options, const ShardMap& map,
                                              runtime::cuda::GpuContext* gpu) {
  validateGroups(options.groups, map.numel());
  std::unique_ptr<Optimizer> optimizer = makeChecked(options, map.shardNumel(), gpu);
  optimizer->shardOver(map);
  return optimizer;
}

std::unique_ptr<Optimizer> makeOptimizer(const OptimizerOptions& options, size_t numel, runtime::cuda::GpuContext* gpu) {
  validateGroups(options.groups, numel);
  return makeChecked(options, numel, gpu);
}

}  // namespace cohort::nn
