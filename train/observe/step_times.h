// StepTimes: where the job's steps spent their time in one epoch (--step-report, and with --trace),
// from every rank's timeline totals (train/observe/timeline.h), and which rank holds the others up.
//
// Per step, mean over the ranks (each rank's totals over its own steps):
//   compute        forward + backward + optimizer (norm, clipping, update)
//   communication  gradient synchronisation the step waited for: the bucket all-reduces not hidden
//                  by backward (replicas, mpi, nccl), or averaging the slice (the shm shared copy)
//   barrier        waiting at barriers for other ranks (the shared copy's step, the loop's)
//   data           waiting for the loader's next batch
//   step           the epoch's training time / its steps (evaluation and checkpoints excluded)
// The bus bandwidth of the gradient all-reduces, nccl-tests' busbw: bytes x 2(n-1)/n / time, the
// time from a step's first bucket issued to its last seen done (the shared copy: the slice's averaging).
// The slowest rank is the one with the most busy time (compute + data wait: what it does itself,
// not waiting for others); its margin is over the median rank's busy time ("rank 3 is 18% slower
// than the median"); the others' barrier wait is what it costs them.
// Thread safety: the training thread; gatherStepTimes is collective (every rank, same order).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "train/job.h"
#include "train/observe/timeline.h"

namespace cohort::train {

struct StepTimes {
  int64_t steps = 0;  // the job's steps in the epoch (rank 0's)
  double stepMs = 0, computeMs = 0, forwardMs = 0, backwardMs = 0, optimizerMs = 0;
  double commMs = 0, barrierMs = 0, dataMs = 0;
  double busbwGBps = 0;         // 0: no gradient all-reduce (local, Hogwild)
  int slowestRank = 0;
  double slowestMargin = 0;     // busy time over the median's, minus 1 (0.18: 18% slower)
  double othersBarrierMs = 0;   // the other ranks' mean barrier wait per step
  std::vector<double> rankBusyMs = {}, rankBarrierMs = {};  // per rank, per step
};

// Collective: the epoch's figures from every rank's totals (taken by the caller with
// Timeline::takeTotals) and its training seconds.
StepTimes gatherStepTimes(Job& job, const Timeline::Totals& totals, double epochSeconds);
// One line: "time per step 12.3 ms: compute 8.1 (forward 2.0, backward 5.0, optimizer 1.1), ...".
std::string describe(const StepTimes& t, int worldSize);
// The metrics' names and values ("step_ms", "compute_ms", ..., "slowest_rank", "slowest_margin").
std::vector<std::pair<std::string, double>> metricsOf(const StepTimes& t);

}  // namespace cohort::train
