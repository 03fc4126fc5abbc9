// The Open MPI backend's Communicator and Works over MpiState (mpi_state.h, where a collective's
// life is described), its creation over MPI_COMM_WORLD, and its groups (split).
#include "collectives/mpi/mpi_communicator.h"

#include <openmpi/mpi.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <utility>

#include "collectives/mpi/mpi_environment.h"
#include "collectives/mpi/mpi_state.h"
#include "collectives/placement.h"
#include "collectives/split.h"
#include "collectives/work_pool.h"
#include "runtime/error.h"

namespace cohort::collectives {
namespace {

using mpi_detail::checkMpi;
using mpi_detail::describeDuration;
using mpi_detail::MpiEnvironment;
using mpi_detail::MpiState;
using mpi_detail::Op;
using mpi_detail::Phase;
using Clock = std::chrono::steady_clock;

// Pooled by the communicator (work_pool.h); keeps the MPI state alive, so it may be waited for
// after the communicator is gone.
class MpiWork : public PooledWork {
 public:
  explicit MpiWork(std::shared_ptr<MpiState> state) : state_(std::move(state)) {}
  void start(const Fingerprint& fingerprint, const void* input, void* output) {
    state_->issue(op_, fingerprint, input, output);
  }
  bool done() override {
    state_->progress();
    return op_->phase == Phase::kDone;
  }
  void wait(std::chrono::milliseconds timeout) override { state_->wait(*op_, timeout); }

 private:
  std::shared_ptr<MpiState> state_;
  std::shared_ptr<Op> op_;  // this collective's; MpiState::pending_ holds it too until it is done
};

std::unique_ptr<Communicator> communicatorOver(MPI_Comm dataComm, MPI_Comm fingerprintComm,
                                               const MpiState::Options& options);

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(std::shared_ptr<MpiState> state) : state_(std::move(state)) {}
  int rank() const override { return state_->rank(); }
  int size() const override { return state_->size(); }
  std::string backend() const override { return "mpi"; }

  WorkPtr allReduce(const void* input, void* output, size_t count, const AllReduceOptions& options) override {
    return start(allReduceCall(input, output, count, options), input, output);
  }
  WorkPtr reduceScatter(const void* input, void* output, size_t countPerRank,
                        const ReduceScatterOptions& options) override {
    return start(reduceScatterCall(input, output, countPerRank, options, rank(), size()), input, output);
  }
  WorkPtr allGather(const void* input, void* output, size_t countPerRank, const AllGatherOptions& options) override {
    return start(allGatherCall(input, output, countPerRank, options, rank(), size()), input, output);
  }
  WorkPtr broadcast(void* data, size_t count, const BroadcastOptions& options) override {
    return start(broadcastCall(data, count, options, size()), data, data);
  }
  WorkPtr barrier() override { return start({.kind = CollectiveKind::kBarrier}, nullptr, nullptr); }

  // MPI_Comm_split of both communicators, once the plan's all-gather (fingerprinted and bounded by
  // the timeout) has shown that every rank arrived: MPI's split itself blocks without a bound.
  // The group's rank is its place in the plan, so MPI orders it as every backend does.
  std::unique_ptr<Communicator> split(const SplitOptions& options) override {
    const SplitPlan plan = planSplit(*this, options, state_->options().timeout);
    const int color = plan.rank < 0 ? MPI_UNDEFINED : plan.color;
    MPI_Comm data = MPI_COMM_NULL, fingerprints = MPI_COMM_NULL;
    checkMpi(MPI_Comm_split(state_->dataComm(), color, plan.rank, &data), "MPI_Comm_split (data)");
    checkMpi(MPI_Comm_split(state_->fingerprintComm(), color, plan.rank, &fingerprints),
             "MPI_Comm_split (fingerprints)");
    if (plan.rank < 0) return nullptr;
    return communicatorOver(data, fingerprints, state_->options());
  }

 private:
  WorkPtr start(const Fingerprint& fingerprint, const void* input, void* output) {
    PooledPtr<MpiWork> work = pool_.acquire(state_);
    work->start(fingerprint, input, output);
    return work;
  }

  std::shared_ptr<MpiState> state_;
  WorkPool<MpiWork> pool_;  // its idle Works hold state_ too; Works in use free themselves
};

std::unique_ptr<Communicator> communicatorOver(MPI_Comm dataComm, MPI_Comm fingerprintComm,
                                               const MpiState::Options& options) {
  for (MPI_Comm comm : {dataComm, fingerprintComm}) {
    checkMpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  }
  return std::make_unique<MpiCommunicator>(
      std::make_shared<MpiState>(MpiEnvironment::acquire(), dataComm, fingerprintComm, options));
}

// MPI_Comm_idup polled with a timeout: every rank must create its communicator.
MPI_Comm duplicateWorld(std::chrono::milliseconds timeout, const char* purpose) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  checkMpi(MPI_Comm_idup(MPI_COMM_WORLD, &comm, &request), "MPI_Comm_idup");
  const Clock::time_point deadline = Clock::now() + timeout;
  for (;;) {
    int done = 0;
    checkMpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Comm_idup");
    if (done) break;
    if (Clock::now() >= deadline) {
      MpiEnvironment::acquire().markUnclean();
      COHORT_THROW(TimeoutError) << "mpi backend: not every rank created its communicator (" << purpose << ") within "
                                 << describeDuration(timeout);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return comm;
}

}  // namespace

std::unique_ptr<Communicator> makeMpiCommunicator(const CommunicatorOptions& options) {
  MpiEnvironment::acquire();
  int rank = 0;
  int size = 0;
  checkMpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  checkMpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  if (rank != options.world.rank || size != options.world.worldSize) {
    COHORT_THROW(InvalidArgument) << "the mpi backend sees rank " << rank << " of " << size
                                  << ", but this worker was told rank " << options.world.rank << " of "
                                  << options.world.worldSize << " (from " << options.world.source
                                  << " variables); start the workers with mpirun to use --backend mpi";
  }
  MPI_Comm data = duplicateWorld(options.timeout, "data");
  MPI_Comm fingerprints = duplicateWorld(options.timeout, "fingerprints");
  return communicatorOver(data, fingerprints,
                          {.worldRank = rank, .timeout = options.timeout, .faultInjection = options.faultInjection});
}

std::unique_ptr<Communicator> makeMpiCommunicator(const CommunicatorOptions& options, int color) {
  if (color < 0) COHORT_THROW(InvalidArgument) << "makeMpiCommunicator: color " << color << " is negative";
  return makeMpiCommunicator(options)->split({.color = color});
}

}  // namespace cohort::collectives
