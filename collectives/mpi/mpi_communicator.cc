// The Open MPI backend. How one collective runs (docs/collectives.md, "MPI backend"):
//
//  1. issue: the Op gets the next sequence number and its Fingerprint. On the fingerprint
//     communicator (a duplicate of MPI_COMM_WORLD, so these messages never meet user traffic) it
//     posts one MPI_Irecv per peer and one MPI_Isend of its own fingerprint per peer, all with the
//     same tag: MPI keeps messages between two ranks on one tag in order, so the k-th fingerprint a
//     rank receives from a peer is that peer's k-th collective even when sequences diverge.
//  2. progress (run by every issue, done() and wait()): Ops leave the fingerprint phase strictly in
//     issue order. When all of an Op's fingerprint requests are complete, every rank holds every
//     rank's fingerprint, so every rank reaches the same verdict: a mismatch throws the same
//     InvalidArgument on all ranks and the data collective is never started; a match starts the
//     non-blocking MPI collective (MPI_Iallreduce, ...) on the data communicator.
//  3. the data request is polled with MPI_Test; avg scales the sum by float(1/n) when it completes.
// wait(timeout) polls progress with a backoff (spin, then yield, then short sleeps). When it runs
// out it names the ranks whose fingerprints are missing, or says that MPI itself did not finish.
// Any error poisons the communicator: every later wait() rethrows it.
#include "collectives/mpi/mpi_communicator.h"

#include <openmpi/mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <exception>
#include <sstream>
#include <thread>
#include <vector>

#include "collectives/mpi/mpi_environment.h"
#include "collectives/mpi/mpi_fingerprint.h"
#include "runtime/error.h"

namespace cohort::collectives {
namespace {

using mpi_detail::checkMpi;
using mpi_detail::MpiEnvironment;
using mpi_detail::WireFingerprint;
using Clock = std::chrono::steady_clock;

constexpr int kFingerprintTag = 7;

enum class Phase { kFingerprints, kData, kDone };

struct Op {
  Fingerprint fingerprint;
  WireFingerprint sent;                   // the send buffer of every fingerprint Isend
  std::vector<WireFingerprint> received;  // by rank; received[self] = sent
  std::vector<MPI_Request> recvRequests;  // by rank; MPI_REQUEST_NULL for self and once complete
  std::vector<MPI_Request> sendRequests;
  MPI_Request dataRequest = MPI_REQUEST_NULL;
  Phase phase = Phase::kFingerprints;
  const float* input = nullptr;
  float* output = nullptr;
};

std::string describeRanks(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  return os.str();
}

std::string describeDuration(std::chrono::milliseconds timeout) {
  std::ostringstream os;
  if (timeout.count() % 1000 == 0)
    os << timeout.count() / 1000 << " s";
  else
    os << timeout.count() << " ms";
  return os.str();
}

MPI_Op mpiOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_SUM;
}

// Everything the communicator and its Works share; Works keep it alive.
class MpiState {
 public:
  MpiState(MpiEnvironment& environment, int rank, int size, MPI_Comm dataComm, MPI_Comm fingerprintComm,
           std::chrono::milliseconds drainTimeout)
      : environment_(environment),
        rank_(rank),
        size_(size),
        dataComm_(dataComm),
        fingerprintComm_(fingerprintComm),
        drainTimeout_(drainTimeout) {}

  ~MpiState() {
    // Collectives nobody waited for are finished first (bounded), so MPI can still be finalised.
    const Clock::time_point deadline = Clock::now() + drainTimeout_;
    while (!error_ && !pending_.empty() && Clock::now() < deadline) {
      try {
        progress();
      } catch (...) {
        break;  // progress() recorded the error and abandoned the requests
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (!pending_.empty() || error_) {
      abandon();
      return;  // a communicator with requests left is not freed (MPI_Comm_free would wait for them)
    }
    MPI_Comm_free(&dataComm_);
    MPI_Comm_free(&fingerprintComm_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }

  std::shared_ptr<Op> issue(Fingerprint fingerprint, const float* input, float* output) {
    if (error_) std::rethrow_exception(error_);
    if (fingerprint.count > static_cast<uint64_t>(INT_MAX)) {
      COHORT_THROW(InvalidArgument) << "the mpi backend handles at most " << INT_MAX
                                    << " elements per collective (per rank), got " << fingerprint.count;
    }
    fingerprint.sequence = nextSequence_++;
    auto op = std::make_shared<Op>();
    op->fingerprint = fingerprint;
    op->sent = WireFingerprint::from(fingerprint);
    op->input = input;
    op->output = output;
    op->received.assign(size_, WireFingerprint{});
    op->received[rank_] = op->sent;
    op->recvRequests.assign(size_, MPI_REQUEST_NULL);
    op->sendRequests.assign(size_, MPI_REQUEST_NULL);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      checkMpi(MPI_Irecv(&op->received[peer], sizeof(WireFingerprint), MPI_BYTE, peer, kFingerprintTag,
                         fingerprintComm_, &op->recvRequests[peer]),
               "MPI_Irecv (fingerprint)");
      checkMpi(MPI_Isend(&op->sent, sizeof(WireFingerprint), MPI_BYTE, peer, kFingerprintTag, fingerprintComm_,
                         &op->sendRequests[peer]),
               "MPI_Isend (fingerprint)");
    }
    pending_.push_back(op);
    progress();
    return op;
  }

  // Advances every pending Op as far as it can go without blocking. Rethrows the poisoning error.
  void progress() {
    if (error_) std::rethrow_exception(error_);
    try {
      bool earlierWaitingForFingerprints = false;
      for (auto& op : pending_) {
        if (op->phase == Phase::kFingerprints && !earlierWaitingForFingerprints) {
          if (fingerprintsComplete(*op)) {
            checkFingerprints(*op);
            startData(*op);
          } else {
            earlierWaitingForFingerprints = true;  // data collectives start in issue order
          }
        }
        if (op->phase == Phase::kData) testData(*op);
      }
      std::erase_if(pending_, [](const std::shared_ptr<Op>& op) { return op->phase == Phase::kDone; });
    } catch (...) {
      error_ = std::current_exception();
      abandon();
      throw;
    }
  }

  void wait(Op& op, std::chrono::milliseconds timeout) {
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline = start + timeout;
    std::chrono::microseconds sleep{0};
    for (;;) {
      progress();
      if (op.phase == Phase::kDone) return;
      const Clock::time_point now = Clock::now();
      if (now >= deadline) break;
      // Spin for the first 100 us (small collectives finish there), yield for 2 ms, then sleep
      // with a backoff capped at 1 ms so a long wait costs little CPU.
      if (now - start < std::chrono::microseconds(100)) continue;
      if (now - start < std::chrono::milliseconds(2)) {
        std::this_thread::yield();
        continue;
      }
      sleep = std::min(std::chrono::microseconds(1000), sleep + std::chrono::microseconds(50));
      std::this_thread::sleep_for(sleep);
    }
    try {
      throwTimeout(op, timeout);
    } catch (...) {
      error_ = std::current_exception();
      abandon();
      throw;
    }
  }

 private:
  bool fingerprintsComplete(Op& op) {
    for (auto* requests : {&op.recvRequests, &op.sendRequests}) {
      for (MPI_Request& request : *requests) {
        if (request == MPI_REQUEST_NULL) continue;
        int done = 0;
        checkMpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test (fingerprint)");
      }
    }
    auto complete = [](const std::vector<MPI_Request>& rs) {
      return std::all_of(rs.begin(), rs.end(), [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
    };
    return complete(op.recvRequests) && complete(op.sendRequests);
  }

  // Every rank holds the same table, so every rank builds the same message.
  void checkFingerprints(const Op& op) {
    std::vector<Fingerprint> byRank(size_);
    for (int r = 0; r < size_; ++r) byRank[r] = op.received[r].toFingerprint();
    if (std::all_of(byRank.begin(), byRank.end(), [&](const Fingerprint& f) { return f == byRank[0]; })) return;
    // Group the ranks by what they issued, in order of the lowest rank of each group.
    std::vector<std::pair<Fingerprint, std::vector<int>>> groups;
    for (int r = 0; r < size_; ++r) {
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == byRank[r]; });
      if (it == groups.end())
        groups.push_back({byRank[r], {r}});
      else
        it->second.push_back(r);
    }
    std::ostringstream os;
    os << "collective mismatch: ";
    for (size_t g = 0; g < groups.size(); ++g) {
      if (g == 1)
        os << " but ";
      else if (g > 1)
        os << " and ";
      os << describeRanks(groups[g].second) << " issued " << groups[g].first.str();
    }
    os << " (no data was exchanged)";
    throw InvalidArgument(os.str());
  }

  void startData(Op& op) {
    const Fingerprint& f = op.fingerprint;
    const int count = static_cast<int>(f.count);
    const bool inPlace = op.input == op.output;
    const void* send = inPlace ? MPI_IN_PLACE : op.input;
    switch (f.kind) {
      case CollectiveKind::kAllReduce:
        checkMpi(MPI_Iallreduce(send, op.output, count, MPI_FLOAT, mpiOp(f.op), dataComm_, &op.dataRequest),
                 "MPI_Iallreduce");
        break;
      case CollectiveKind::kReduceScatter:
        // In place: the input is output[0, size*count) and the result lands in output[0, count).
        checkMpi(MPI_Ireduce_scatter_block(send, op.output, count, MPI_FLOAT, mpiOp(f.op), dataComm_, &op.dataRequest),
                 "MPI_Ireduce_scatter_block");
        break;
      case CollectiveKind::kAllGather:
        // In place (input == output): this rank's chunk is at output[0, count); MPI wants it at
        // chunk `rank`, so move it there first (only this rank's own buffer is touched).
        if (inPlace && rank_ != 0 && count > 0) {
          std::memmove(op.output + static_cast<size_t>(rank_) * count, op.output, sizeof(float) * count);
        }
        if (op.input == op.output + static_cast<size_t>(rank_) * count) send = MPI_IN_PLACE;
        checkMpi(MPI_Iallgather(send, count, MPI_FLOAT, op.output, count, MPI_FLOAT, dataComm_, &op.dataRequest),
                 "MPI_Iallgather");
        break;
      case CollectiveKind::kBroadcast:
        checkMpi(MPI_Ibcast(op.output, count, MPI_FLOAT, f.root, dataComm_, &op.dataRequest), "MPI_Ibcast");
        break;
      case CollectiveKind::kBarrier:
        checkMpi(MPI_Ibarrier(dataComm_, &op.dataRequest), "MPI_Ibarrier");
        break;
    }
    op.phase = Phase::kData;
  }

  void testData(Op& op) {
    int done = 0;
    checkMpi(MPI_Test(&op.dataRequest, &done, MPI_STATUS_IGNORE), op.fingerprint.str().c_str());
    if (!done) return;
    const Fingerprint& f = op.fingerprint;
    if (f.op == ReduceOp::kAvg && (f.kind == CollectiveKind::kAllReduce || f.kind == CollectiveKind::kReduceScatter)) {
      // avg is float(sum) * float(1/n) in every backend (docs/collectives.md), so a job gives the
      // same bits on shm and mpi; exact when n is a power of two.
      const float scale = 1.0f / static_cast<float>(size_);
      for (uint64_t i = 0; i < f.count; ++i) op.output[i] *= scale;
    }
    op.phase = Phase::kDone;
  }

  [[noreturn]] void throwTimeout(const Op& op, std::chrono::milliseconds timeout) {
    // The earliest Op still exchanging fingerprints holds everything after it back.
    for (const auto& pendingOp : pending_) {
      if (pendingOp->phase != Phase::kFingerprints) continue;
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r) {
        if (pendingOp->recvRequests[r] != MPI_REQUEST_NULL) missing.push_back(r);
      }
      std::ostringstream os;
      os << "collective " << op.fingerprint.str() << ": ";
      if (pendingOp.get() != &op)
        os << "waiting for the earlier collective " << pendingOp->fingerprint.str() << ", for which ";
      if (missing.empty())
        os << "this rank's fingerprint messages were not delivered within " << describeDuration(timeout);
      else
        os << describeRanks(missing) << " did not arrive within " << describeDuration(timeout);
      throw TimeoutError(os.str());
    }
    COHORT_THROW(TimeoutError) << "collective " << op.fingerprint.str()
                               << ": every rank arrived, but MPI did not finish the "
                               << "data transfer within " << describeDuration(timeout);
  }

  // After an error: cancel the fingerprint receives nobody will complete; any request that
  // cannot be finished keeps MPI_Finalize from running at exit (it could hang on it).
  void abandon() {
    bool clean = true;
    for (auto& op : pending_) {
      if (op->phase == Phase::kData) clean = false;
      for (MPI_Request& request : op->recvRequests) {
        if (request == MPI_REQUEST_NULL) continue;
        MPI_Cancel(&request);
        int done = 0;
        MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        if (!done) clean = false;
      }
      for (MPI_Request& request : op->sendRequests) {
        if (request == MPI_REQUEST_NULL) continue;
        int done = 0;
        MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        if (!done) clean = false;
      }
    }
    if (!clean) environment_.markUnclean();
  }

  MpiEnvironment& environment_;
  int rank_;
  int size_;
  MPI_Comm dataComm_;
  MPI_Comm fingerprintComm_;
  std::chrono::milliseconds drainTimeout_;  // how long the destructor finishes unwaited collectives
  uint64_t nextSequence_ = 0;
  std::vector<std::shared_ptr<Op>> pending_;  // issue order
  std::exception_ptr error_;
};

class MpiWork : public Work {
 public:
  MpiWork(std::shared_ptr<MpiState> state, std::shared_ptr<Op> op) : state_(std::move(state)), op_(std::move(op)) {}
  bool done() override {
    state_->progress();
    return op_->phase == Phase::kDone;
  }
  void wait(std::chrono::milliseconds timeout) override { state_->wait(*op_, timeout); }

 private:
  std::shared_ptr<MpiState> state_;
  std::shared_ptr<Op> op_;
};

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(std::shared_ptr<MpiState> state) : state_(std::move(state)) {}
  int rank() const override { return state_->rank(); }
  int size() const override { return state_->size(); }
  std::string backend() const override { return "mpi"; }

  WorkPtr allReduce(const float* input, float* output, size_t count, const AllReduceOptions& options) override {
    return start({.kind = CollectiveKind::kAllReduce, .op = options.op, .count = count}, input, output);
  }
  WorkPtr reduceScatter(const float* input, float* output, size_t countPerRank, ReduceOp op) override {
    return start({.kind = CollectiveKind::kReduceScatter, .op = op, .count = countPerRank}, input, output);
  }
  WorkPtr allGather(const float* input, float* output, size_t countPerRank) override {
    return start({.kind = CollectiveKind::kAllGather, .count = countPerRank}, input, output);
  }
  WorkPtr broadcast(float* data, size_t count, int root) override {
    if (root < 0 || root >= size()) {
      COHORT_THROW(InvalidArgument) << "broadcast root " << root << " is not a rank of this world of " << size();
    }
    return start({.kind = CollectiveKind::kBroadcast, .root = root, .count = count}, data, data);
  }
  WorkPtr barrier() override { return start({.kind = CollectiveKind::kBarrier}, nullptr, nullptr); }

 private:
  WorkPtr start(const Fingerprint& fingerprint, const float* input, float* output) {
    return std::make_unique<MpiWork>(state_, state_->issue(fingerprint, input, output));
  }

  std::shared_ptr<MpiState> state_;
};

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
  checkMpi(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  return comm;
}

}  // namespace

std::unique_ptr<Communicator> makeMpiCommunicator(const CommunicatorOptions& options) {
  MpiEnvironment& environment = MpiEnvironment::acquire();
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
  MPI_Comm dataComm = duplicateWorld(options.timeout, "data");
  MPI_Comm fingerprintComm = duplicateWorld(options.timeout, "fingerprints");
  return std::make_unique<MpiCommunicator>(
      std::make_shared<MpiState>(environment, rank, size, dataComm, fingerprintComm, options.timeout));
}

}  // namespace cohort::collectives
