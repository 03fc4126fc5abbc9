// `cohort bench memory`: what one rank of a ZeRO job holds of the model's state at one stage, measured
// against the formula (docs/sharding.md, "Memory per rank"; issue 46, item 4). Run under cohortrun,
// one job per stage (a process's peak resident size only grows, so each stage gets fresh processes;
// bench/zero_memory_bench.sh runs the stages and world sizes in turn):
//
//   cohortrun --nproc-per-node 2 -- cohort bench memory --zero 1 [--zero-scope job|node]
//       [--model gpt:layers=12,heads=4,dim=256,ctx=64,vocab=256] [--batch-size 1] [--steps 1]
//       [--device cpu|cuda]
//
// Each rank builds the model, makes an AdamW optimizer for it, and places both in a Job of mode
// allreduce at --zero (stage 0: replicas, ZeRO's baseline), then trains --steps steps of random
// tokens (a step may allocate what its units in flight need). It prints one line per rank:
//   RESULT bench=zero_memory model=… zero=Z scope=job world_size=W group=W rank=R
//          params=B grads=B optimizer=B staging=B                        (Job::stateBytes())
//          formula_params=B formula_grads=B formula_optimizer=B formula_staging=B  (train/zero_memory.h)
//          model_state_ratio=x   (measured params + grads + optimizer over the formula's)
//          staging_ratio=x       (measured staging over the formula's; 1 where both are 0)
//          held_rss=B held_ratio=x  (VmRSS after the placement less before the optimizer was made,
//                                    over stateBytes().total())
//          peak_rss=B peak_ratio=x  (VmHWM's growth over making the optimizer and placing, the same)
//   and with --device cuda (one GPU per rank) the GPU caching allocator's statistics besides:
//          device_held=B device_ratio=x  (allocated bytes after the placement less before the
//                                         optimizer was made, over the formula's model state:
//                                         params + grads + optimizer; the windows come later)
//          device_peak=B device_peak_ratio=x  (the peak allocated after the steps less the same,
//                                              over the formula's total, staging in: it counts
//                                              the placement's transients and the activations too)
// The resident figures cross-check the accounting: they count pages the process touched, shared
// memory included, and what the C library keeps or returns, so they agree loosely (the docs give
// the measured spread); the peak also counts the placement's transients (the caller's whole-model
// optimizer state and the whole parameter buffers before a sharded placement moves them).
// A stage the job refuses (stage 3 until it is built) prints, on rank 0, one line instead:
//   RESULT bench=zero_memory model=… zero=3 scope=job world_size=W status=refused reason: <message>
// and exits 0. Single-threaded caller; --threads BLAS threads per rank.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace cohort::bench {

struct ZeroMemoryBenchOptions {
  std::string model = "gpt:layers=12,heads=4,dim=256,ctx=64,vocab=256";
  int zero = 1;
  std::string zeroScope = "job";
  int64_t batchSize = 1;
  int steps = 1;
  int threads = 1;
  std::string device = "cpu";  // or "cuda": one GPU per rank
};

void addZeroMemoryBenchFlags(CLI::App& command, ZeroMemoryBenchOptions& options);
// InvalidArgument for a model that is no GPT, or counts below 1.
int runZeroMemoryBench(const ZeroMemoryBenchOptions& options);

}  // namespace cohort::bench
