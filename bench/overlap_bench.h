// `cohort bench train --mode allreduce`: what overlapping the gradient all-reduce with backward buys
// in synchronous data-parallel training (docs/collectives.md, "Backward overlap"). Every rank of the
// job (run it under cohortrun or mpirun) trains the same model on its own batches through a
// train::Job in allreduce mode with replicas (GradSync's bucketed all-reduce; over nccl on GPUs).
// The same Job measures both sides, interleaved, --repeats times each: `on`, the pass carries the
// job's unit listener (buckets start as backward finishes their units), and `off`, the pass carries
// none (every bucket starts when backward has returned, as before the GPT reported its units). Each
// run is --samples windows/samples per rank (default 30 batches) after 5 warm-up steps; its time is
// the slowest rank's. Each worker computes with the first of --threads BLAS threads.
// Prints per side
// With --zero Z the job shards at ZeRO stage Z (docs/sharding.md; `off` then means the reduce-scatters
// all start after backward).
//   RESULT bench=train_allreduce model=… device=… workers=N batch=B zero=Z overlap=on step_ms=.. min=.. max=..
//          samples_per_s=..   (one line)
// and, with both sides, one line `… off_over_on=..` (the step time without overlap over with it).
// Models: mlp:…, cnn:…, gpt:… (windows of random bytes, AdamW as bench train's GPT).
#pragma once

#include "bench/train_bench.h"

namespace cohort::bench {

// Collective: every rank of the world calls it with the same options.
int runOverlapBench(const TrainBenchOptions& options);

}  // namespace cohort::bench
