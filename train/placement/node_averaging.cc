#include "train/placement/node_averaging.h"

#include <algorithm>
#include <cstdio>

#include "collectives/mpi/mpi_communicator.h"
#include "runtime/digest.h"
#include "runtime/error.h"
#include "train/placement/job_collectives.h"

namespace cohort::train {

namespace {

// What each rank adds to its row of a gather: its steps since the last full average, and (leaders)
// the rounds it started since then; -1 for the other workers.
constexpr size_t kMetaValues = 2;

}  // namespace

NodeAveraging::NodeAveraging(const NodeAveragingOptions& o)
    : world_(o.world),
      timeout_(o.timeout),
      every_(o.every),
      params_(o.params),
      nodeBarrier_(o.nodeBarrier),
      timeline_(o.timeline) {
  COHORT_CHECK(every_ >= 1 && timeline_ && nodeBarrier_) << "averaging every " << every_ << " steps";
  const collectives::CommunicatorOptions options{
      .backend = "mpi", .world = world_, .timeout = timeout_, .faultInjection = o.faultInjection};
  all_ = collectives::makeMpiCommunicator(options);
  leaders_ = collectives::makeMpiCommunicator(options, leader() ? 0 : 1);
  if (leader()) {
    snapshot_.resize(params_.size());
    average_.resize(params_.size());
    leaders_->broadcast(params_.data(), params_.size(), 0)->wait(timeout_);
  }
  nodeBarrier_("the first node's parameters");
  if (!o.testLogDir.empty() && leader()) logPath_ = o.testLogDir + "/average.rank" + std::to_string(world_.rank);
}

// A round nobody waited for is finished by the communicator's destructor (bounded by the timeout).
NodeAveraging::~NodeAveraging() = default;

void NodeAveraging::afterStep() {
  ++steps_;
  if (!leader()) return;
  if (round_ && round_->done()) finishRound();
  if (steps_ % every_ == 0) startRound();
}

void NodeAveraging::startRound() {
  if (round_) {
    Timeline::Scope span(*timeline_, SpanKind::kCommWait);
    finishRound();  // the previous round is due: wait for it (bounded)
  }
  // The workers go on updating the copy while it is read: the snapshot is a Hogwild read like any
  // worker's forward pass, and what it took is exactly what `average - snapshot` replaces.
  std::copy(params_.begin(), params_.end(), snapshot_.begin());
  average_ = snapshot_;
  round_ = leaders_->allReduce(average_.data(), average_.data(), average_.size(), {.op = collectives::ReduceOp::kAvg});
  ++roundsStarted_;
}

void NodeAveraging::finishRound() {
  round_->wait(timeout_);
  round_.reset();
  for (size_t i = 0; i < params_.size(); ++i) params_[i] += average_[i] - snapshot_[i];
  ++rounds_;
}

// Every worker of every node waits at a meeting: nobody updates the copy while the leaders average it.
void NodeAveraging::averageNow() {
  Timeline::Scope span(*timeline_, SpanKind::kBarrier);
  if (leader()) {
    if (round_) finishRound();
    leaders_->allReduce(params_.data(), params_.data(), params_.size(), {.op = collectives::ReduceOp::kAvg})
        ->wait(timeout_);
  }
  nodeBarrier_("the average across nodes");
  steps_ = 0;
  roundsStarted_ = 0;
  ++fullAverages_;
  log("average " + std::to_string(fullAverages_), " rounds " + std::to_string(rounds_));
}

void NodeAveraging::loaded() const { log("loaded", ""); }

std::vector<double> NodeAveraging::gather(std::span<const double> mine) {
  const size_t n = mine.size() + kMetaValues;
  const auto ranks = static_cast<size_t>(world_.worldSize);
  std::vector<double> row(mine.begin(), mine.end());
  row.push_back(static_cast<double>(steps_));
  row.push_back(leader() ? static_cast<double>(roundsStarted_) : -1.0);
  const std::vector<double> rows = gatherDoubles(*all_, row, timeout_);

  std::vector<double> values(ranks * mine.size());
  bool stepped = false;
  int firstLeader = -1;
  for (size_t r = 0; r < ranks; ++r) {
    const double* meta = &rows[r * n + mine.size()];
    std::copy_n(&rows[r * n], mine.size(), &values[r * mine.size()]);
    stepped = stepped || meta[0] > 0;
    if (meta[1] < 0) continue;
    if (firstLeader < 0) firstLeader = static_cast<int>(r);
    const double first = rows[static_cast<size_t>(firstLeader) * n + mine.size() + 1];
    if (meta[1] != first) {
      COHORT_THROW(InvalidArgument) << "Hogwild across nodes: the leader of rank " << firstLeader << "'s node started "
                                    << first << " averaging rounds since the last meeting and rank " << r << "'s "
                                    << meta[1]
                                    << ": every node must take the same number of steps between the "
                                       "job's meetings (equal shards of the data; a loop of your own: the same "
                                       "batches on every rank)";
    }
  }
  if (stepped) averageNow();
  return values;
}

std::vector<float> NodeAveraging::gatherFloats(std::span<const float> mine) {
  std::vector<float> all(static_cast<size_t>(world_.worldSize) * mine.size());
  if (!mine.empty()) all_->allGather(mine.data(), all.data(), mine.size(), {})->wait(timeout_);
  return all;
}

// "WHAT DIGEST AFTER", DIGEST of the node's copy (leaders, with the test hook only).
void NodeAveraging::log(const std::string& what, const std::string& after) const {
  if (logPath_.empty()) return;
  runtime::Digest digest;
  digest.add(params_.data(), params_.size_bytes());
  std::FILE* f = std::fopen(logPath_.c_str(), "a");
  if (!f) COHORT_THROW(IoError) << "the averaging log (a test hook): cannot open " << logPath_;
  std::fputs((what + " " + digest.hex() + after + "\n").c_str(), f);
  std::fclose(f);
}

}  // namespace cohort::train
