// JobCollectives: what a job's ranks do together outside the step — barriers, the reduction of the
// loop's figures (loss, throughput, stop votes), the check on peers a rank depends on, and telling
// waiting peers why this rank fails. The other half of what was one Strategy interface; the
// placement (train/placement/placement.h) is the first. Internal to train/: users reach it through Job.
//
// One reduce. reduce() is written once, here: every rank's values are gathered as raw bits
// (gatherRows, the transport's part) and every rank adds the rows in rank order (reduceRows), so
// Job::reduce gives the same bits in every mode and on every backend, and every rank the same.
// Implementations: LocalCollectives (one rank), CommCollectives (over a Communicator: replicas),
// and those of the shared-memory placements (train/placement/segment_placement.h, train/placement/hogwild_placement.h).
// A JobCollectives borrows the transports its placement set up: destroy it first.
// Every wait is bounded by the job's timeout (TimeoutError or PeerError naming the rank).
// Collective: every rank calls barrier() and reduce() with the same names, sizes, in the same order.
// Thread safety: the training thread only.
#pragma once

#include <chrono>
#include <span>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/error.h"
#include "train/observe/timeline.h"

namespace cohort::train {

enum class ScalarOp { kSum, kMean, kMax };

class JobCollectives {
 public:
  virtual ~JobCollectives() = default;

  virtual void barrier(const std::string& what) = 0;
  // The one reduce: `values` reduced elementwise with `op` over every rank, in rank order.
  void reduce(std::span<double> values, ScalarOp op);
  // Whether ranks step together: Hogwild workers do not, so a collective between epoch ends would
  // stall them.
  virtual bool lockstep() const { return true; }
  // Throws PeerError when a rank this one depends on has gone (GPU Hogwild: the owner of the
  // shared parameters), looking for up to `settle` (see ipc::DeviceShare::throwIfOwnerLost).
  virtual void checkPeers(std::chrono::milliseconds settle) { (void)settle; }
  // This rank is failing with `error` (called before it unwinds out of a step, barrier() or
  // reduce()): ranks of its node that wait for it in shared memory fail at once with its reason
  // rather than time out on it (ipc::ProcessBarrier::abandon).
  virtual void abandon(const Error& error) { (void)error; }

 protected:
  // Every rank's `mine` (the same size on every rank), rank-major, exactly as each rank had it;
  // `ranks` is set to how many rows there are.
  virtual std::vector<double> gatherRows(std::span<const double> mine, int& ranks) = 0;
};

// `values` reduced elementwise with `op` over `ranks` rank-major rows of all (values.size() each),
// added in rank order.
void reduceRows(std::span<double> values, std::span<const double> all, int ranks, ScalarOp op);
// Every rank's `mine` (the same size on every rank), rank-major, gathered over `comm` as raw bits:
// each rank reduces exactly the values the others had (doubles do not survive a float reduction).
// Host memory on every backend (nccl: staged broadcasts, each rank's row in turn).
std::vector<double> gatherDoubles(collectives::Communicator& comm, std::span<const double> mine,
                                  std::chrono::milliseconds timeout);

// One rank: barriers are nothing and a reduction is the rank's own values.
class LocalCollectives final : public JobCollectives {
 public:
  void barrier(const std::string&) override {}

 protected:
  std::vector<double> gatherRows(std::span<const double> mine, int& ranks) override;
};

// Over a communicator of the whole world (replicas: shm, mpi, hierarchical, nccl), which the
// placement owns. Barriers are kBarrier spans of the timeline.
class CommCollectives final : public JobCollectives {
 public:
  CommCollectives(collectives::Communicator& comm, std::chrono::milliseconds timeout, Timeline& timeline)
      : comm_(comm), timeout_(timeout), timeline_(timeline) {}
  void barrier(const std::string& what) override;

 protected:
  std::vector<double> gatherRows(std::span<const double> mine, int& ranks) override;

 private:
  collectives::Communicator& comm_;
  std::chrono::milliseconds timeout_;
  Timeline& timeline_;
};

}  // namespace cohort::train
