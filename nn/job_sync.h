// JobSync: how the workers of one job line up around the training loop. The Trainer calls it at a
// few fixed points; --mode local has none (the Trainer gets nullptr), --mode hogwild uses the shared
// segment's barrier and per-rank slots (nn/hogwild.h).
//
// Every rank calls barrier() with the same names in the same order. reportProgress() publishes this
// rank's cumulative training figures; after a barrier, jobProgress() sums them over the job.
// shareOptimizerState() copies this rank's optimizer state where rank 0 can read it;
// gatheredOptimizerState() (rank 0, after a barrier) returns every rank's, named
// "optimizer.rank<k>.<state>", for the checkpoint. Waits throw TimeoutError or PeerError naming the
// ranks that did not arrive. Thread safety: called from the training thread only.
#pragma once

#include <string>
#include <vector>

#include "nn/checkpoint.h"
#include "nn/module.h"
#include "nn/optimizer.h"

namespace cohort::nn {

struct JobProgress {
  int64_t samples = 0;           // trained samples, all ranks
  double trainSeconds = 0;       // the slowest rank's training time (evaluation excluded)
};

class JobSync {
 public:
  virtual ~JobSync() = default;
  virtual void barrier(const std::string& what) = 0;
  virtual void reportProgress(int64_t samples, double trainSeconds, int64_t optimizerSteps) = 0;
  virtual JobProgress jobProgress() const = 0;
  // Every rank's optimizer step count as last reported (rank 0, after a barrier).
  virtual std::vector<int64_t> optimizerSteps() const = 0;
  virtual void shareOptimizerState(const Optimizer& optimizer) = 0;
  virtual std::vector<NamedTensor> gatheredOptimizerState(const Optimizer& optimizer) const = 0;

  // Replicated training (allreduce): every rank holds identical parameters and optimizer state, so a
  // checkpoint is rank 0's own state and every rank resumes from it in full.
  virtual bool replicated() const { return false; }
  // Gradient synchronisation around backward (allreduce): told as gradients become final, then
  // synchronizeGradients() before the optimizer step.
  virtual GradReadyListener* gradReady() { return nullptr; }
  virtual void synchronizeGradients() {}
  // The optimizer step after synchronizeGradients(): the whole step here; a sharded sync updates
  // this rank's shard and lines the ranks up around it (nn/sharded_sync.h).
  virtual void optimizerStep(Optimizer& optimizer, const Tensor& params, const Tensor& grads) {
    optimizer.step(params, grads);
  }
  // True on every rank when any rank wants to stop now (a signal reaches ranks at different steps);
  // called by every rank after every step. Unsupported (always false) where ranks do not step together.
  virtual bool anyRankStopping(bool thisRank) { return false; }
  // The mean of `value` over the ranks (every rank calls it, same order); this rank's value where the
  // ranks have no collective for it (Hogwild reports rank 0's figures).
  virtual double averageOverRanks(double value) { return value; }
};

}  // namespace cohort::nn
