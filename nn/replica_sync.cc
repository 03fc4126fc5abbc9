#include "nn/replica_sync.h"

namespace cohort::nn {

namespace {
collectives::BufferPtr placeGradsForCollectives(collectives::Communicator& comm, ParamBuffer& params) {
  if (!params.values().device().isCpu()) return nullptr;
  collectives::BufferPtr buffer = comm.allocateBuffer(params.numel());
  params.placeGrads(buffer->data());
  return buffer;
}
}  // namespace

ReplicaSync::ReplicaSync(collectives::Communicator& comm, ParamBuffer& params, const GradSyncOptions& options)
    : comm_(comm),
      grads_(placeGradsForCollectives(comm, params)),
      gradSync_(comm, params, options),
      timeout_(options.timeout) {}

void ReplicaSync::barrier(const std::string&) { comm_.barrier()->wait(timeout_); }

// Every rank trains the same number of samples (DistributedSampler pads the shards), so the job's
// samples are this rank's times the world size; the job's time is the slowest rank's.
void ReplicaSync::reportProgress(int64_t samples, double trainSeconds, int64_t optimizerSteps) {
  float seconds = static_cast<float>(trainSeconds);
  comm_.allReduce(&seconds, &seconds, 1, {.op = collectives::ReduceOp::kMax})->wait(timeout_);
  progress_.samples = samples * comm_.size();
  progress_.trainSeconds = seconds;
  steps_ = optimizerSteps;
}

// Every rank trains the same number of samples per epoch, so the mean of the ranks' means is the job's.
double ReplicaSync::averageOverRanks(double value) {
  float v = static_cast<float>(value);
  comm_.allReduce(&v, &v, 1, {.op = collectives::ReduceOp::kAvg})->wait(timeout_);
  return v;
}

bool ReplicaSync::anyRankStopping(bool thisRank) {
  float flag = thisRank ? 1.0f : 0.0f;
  comm_.allReduce(&flag, &flag, 1, {.op = collectives::ReduceOp::kMax})->wait(timeout_);
  return flag != 0.0f;
}

}  // namespace cohort::nn
