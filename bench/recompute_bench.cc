#include "bench/recompute_bench.h"

#include <malloc.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "nn/gpt.h"
#include "nn/gpt_memory.h"
#include "nn/loss.h"
#include "nn/optimizer.h"
#include "nn/param_buffer.h"
#include "runtime/cpu/blas.h"
#include "runtime/error.h"

namespace cohort::bench {

namespace {

// Heap bytes in use: the arena's allocated chunks and the mmap'd ones (where large tensors go).
double heapInUse() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<double>(m.uordblks + m.hblkhd);
}

// Reads the heap at the first block's before-forward, the last block's after-forward and the
// embeddings' after-forward (the GPT's last event of a forward).
class HeapProbe final : public nn::UnitListener {
 public:
  explicit HeapProbe(int64_t layers) : last_("transformer.h." + std::to_string(layers - 1)) {}
  void beforeForward(const nn::ParamBuffer::Unit& u) override {
    if (u.name == "transformer.h.0") beforeBlocks = heapInUse();
  }
  void afterForward(const nn::ParamBuffer::Unit& u) override {
    if (u.name == last_) afterBlocks = heapInUse();
    if (u.name == "transformer.embeddings") afterForwardPass = heapInUse();
  }
  double beforeBlocks = 0, afterBlocks = 0, afterForwardPass = 0;

 private:
  std::string last_;
};

struct ModeRun {
  nn::RecomputeMode mode;
  std::unique_ptr<nn::Gpt> gpt;
  nn::ParamBuffer params;
  nn::SoftmaxCrossEntropy loss;
  std::unique_ptr<nn::Optimizer> optimizer;
  runtime::Rng rng{7};
  double blocksBytes = 0, forwardBytes = 0, stepBytes = 0;
  std::vector<double> stepMs;
};

void step(ModeRun& r, const runtime::Tensor& ids, const runtime::Tensor& targets, nn::UnitListener* units) {
  const nn::Pass pass{.training = true, .rng = &r.rng, .units = units};
  r.loss.forward(r.gpt->forward(ids, pass), targets);
  r.gpt->backward(r.loss.backward(), pass);
  r.optimizer->step(r.params.values(), r.params.grads());
}

// A fresh model of `mode`, its first step measured; parameters seeded alike for every mode.
std::unique_ptr<ModeRun> start(const RecomputeBenchOptions& o, nn::RecomputeMode mode, const runtime::Tensor& ids,
                               const runtime::Tensor& targets) {
  auto r = std::make_unique<ModeRun>();
  r->mode = mode;
  r->gpt = std::make_unique<nn::Gpt>(nn::GptOptions{
      .vocab = o.vocab, .layers = o.layers, .heads = o.heads, .dim = o.dim, .context = o.context, .recompute = mode});
  r->gpt->registerParams(r->params, "");
  r->params.allocate(runtime::cpuAllocator());
  runtime::Rng init(1);
  r->gpt->resetParams(init);
  r->optimizer = nn::makeOptimizer({.kind = nn::OptimizerKind::kSgd, .lr = 1e-4f}, r->params.numel());
  HeapProbe probe(o.layers);
  const double before = heapInUse();
  step(*r, ids, targets, &probe);
  r->blocksBytes = probe.afterBlocks - probe.beforeBlocks;
  r->forwardBytes = probe.afterForwardPass - before;
  r->stepBytes = heapInUse() - before;
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void printMode(const RecomputeBenchOptions& o, const ModeRun& r) {
  nn::GptOptions shape{
      .vocab = o.vocab, .layers = o.layers, .heads = o.heads, .dim = o.dim, .context = o.context, .recompute = r.mode};
  const nn::GptActivationBytes f = nn::gptActivationBytes(shape, {.batch = o.batchSize, .context = o.context});
  std::printf(
      "RESULT bench=recompute mode=%s model=gpt:layers=%lld,heads=%lld,dim=%lld,ctx=%lld,vocab=%lld batch=%lld "
      "threads=%d blocks_bytes=%.0f blocks_formula=%.0f forward_bytes=%.0f step_bytes=%.0f step_ms=%.1f min=%.1f "
      "max=%.1f\n",
      nn::recomputeName(r.mode).c_str(), static_cast<long long>(o.layers), static_cast<long long>(o.heads),
      static_cast<long long>(o.dim), static_cast<long long>(o.context), static_cast<long long>(o.vocab),
      static_cast<long long>(o.batchSize), o.threads, r.blocksBytes, f.blocksForward(), r.forwardBytes, r.stepBytes,
      median(r.stepMs), *std::min_element(r.stepMs.begin(), r.stepMs.end()),
      *std::max_element(r.stepMs.begin(), r.stepMs.end()));
}

}  // namespace

void addRecomputeBenchFlags(CLI::App& c, RecomputeBenchOptions& o) {
  c.add_option("--layers", o.layers, "the GPT's blocks")->capture_default_str();
  c.add_option("--heads", o.heads, "attention heads")->capture_default_str();
  c.add_option("--dim", o.dim, "width")->capture_default_str();
  c.add_option("--vocab", o.vocab, "vocabulary")->capture_default_str();
  c.add_option("--ctx", o.context, "context (tokens per sample)")->capture_default_str();
  c.add_option("--batch-size", o.batchSize, "samples per step")->capture_default_str();
  c.add_option("--steps", o.steps, "timed rounds (one step of every mode each)")->capture_default_str();
  c.add_option("--threads", o.threads, "BLAS threads")->capture_default_str();
  c.add_option("--modes", o.modes, "the recompute modes to compare (none first, for the ratios)")
      ->delimiter(',')
      ->capture_default_str();
}

int runRecomputeBench(const RecomputeBenchOptions& o) {
  if (o.steps < 1 || o.batchSize < 1 || o.modes.empty()) {
    COHORT_THROW(InvalidArgument) << "cohort bench recompute needs --steps, --batch-size and --modes, got " << o.steps
                                  << ", " << o.batchSize << " and " << o.modes.size() << " modes";
  }
  runtime::cpu::setBlasThreads(o.threads);
  runtime::Rng data(3);
  runtime::Tensor ids = runtime::Tensor::zeros({o.batchSize, o.context});
  runtime::Tensor targets = runtime::Tensor::zeros({o.batchSize, o.context});
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ids.at(i) = static_cast<float>(data.below(static_cast<uint64_t>(o.vocab)));
    targets.at(i) = static_cast<float>(data.below(static_cast<uint64_t>(o.vocab)));
  }
  {  // the libraries' own first-call allocations (oneDNN, OpenMP) before anything is measured
    (void)start(
        {.layers = 1, .heads = o.heads, .dim = o.dim, .vocab = 64, .context = o.context, .batchSize = o.batchSize},
        nn::RecomputeMode::kNone, runtime::Tensor::zeros({o.batchSize, o.context}),
        runtime::Tensor::zeros({o.batchSize, o.context}));
  }
  std::vector<std::unique_ptr<ModeRun>> runs;
  for (const std::string& m : o.modes) runs.push_back(start(o, nn::parseRecompute(m), ids, targets));
  for (int s = 0; s < o.steps; ++s) {
    for (auto& r : runs) {
      const auto t0 = std::chrono::steady_clock::now();
      step(*r, ids, targets, nullptr);
      r->stepMs.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  for (const auto& r : runs) printMode(o, *r);
  const ModeRun& none = *runs.front();
  for (size_t i = 1; i < runs.size(); ++i) {
    const ModeRun& r = *runs[i];
    std::printf("RESULT bench=recompute_ratio mode=%s blocks_fewer=%.2f forward_fewer=%.2f time_more=%.3f\n",
                nn::recomputeName(r.mode).c_str(), none.blocksBytes / r.blocksBytes, none.forwardBytes / r.forwardBytes,
                median(r.stepMs) / median(none.stepMs) - 1.0);
  }
  return 0;
}

}  // namespace cohort::bench
