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
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/mpi/mpi_environment.h"
#include "collectives/mpi/mpi_fingerprint.h"
#include "collectives/mpi/mpi_heartbeat.h"
#include "collectives/mpi/mpi_members.h"
#include "collectives/placement.h"
#include "collectives/work_pool.h"
#include "runtime/dtype.h"
#include "runtime/error.h"

namespace cohort::collectives {
namespace {

using mpi_detail::checkMpi;
using mpi_detail::gatherMembers;
using mpi_detail::Heartbeat;
using mpi_detail::Member;
using mpi_detail::MpiEnvironment;
using mpi_detail::WireFingerprint;
using Clock = std::chrono::steady_clock;

constexpr int kFingerprintTag = 7;
// In-place all-reduces from this size send from a copy (see startData).
constexpr uint64_t kInPlaceCopyBytes = 64 * 1024;

enum class Phase { kFingerprints, kData, kDone };

struct Op {
  Fingerprint fingerprint;
  WireFingerprint sent;                   // the send buffer of every fingerprint Isend
  std::vector<WireFingerprint> received;  // by rank; received[self] = sent
  std::vector<MPI_Request> recvRequests;  // by rank; MPI_REQUEST_NULL for self and once complete
  std::vector<MPI_Request> sendRequests;
  MPI_Request dataRequest = MPI_REQUEST_NULL;
  Phase phase = Phase::kFingerprints;
  const void* input = nullptr;
  void* output = nullptr;
  // fp32 working space, kept with the Op (and so with its pooled Work) so that a collective in
  // steady state allocates none: reduce-scatter's rows (every rank's chunk for this rank, in rank
  // order), a large in-place all-reduce's input, a bf16 reduction's widened input and result.
  std::vector<float> scratch;
};

// Widens `count` bf16 values (bits) to fp32, and rounds fp32 values to bf16 once.
void widen(const void* bf16, float* out, size_t count) {
  const auto* in = static_cast<const uint16_t*>(bf16);
  for (size_t i = 0; i < count; ++i) out[i] = runtime::toFloat(runtime::Bf16{in[i]});
}
void narrow(const float* in, void* bf16, size_t count) {
  auto* out = static_cast<uint16_t*>(bf16);
  for (size_t i = 0; i < count; ++i) out[i] = runtime::toBf16(in[i]).bits;
}

// Grows `v` to at least n elements; never shrinks (its memory is reused).
float* atLeast(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

std::string describeDuration(std::chrono::milliseconds timeout) {
  std::ostringstream os;
  if (timeout.count() % 1000 == 0)
    os << timeout.count() / 1000 << " s";
  else
    os << timeout.count() << " ms";
  return os.str();
}

// A test hook (COHORT_TEST_MPI_MISMATCH="RANK:SEQUENCE"): on every mpi communicator, the process of
// world rank RANK issues its collective #SEQUENCE with one element fewer (one more when it has
// none), as a rank with a bug would, so tests can check that the fingerprints catch it on every
// rank before any data moves. Read once per communicator; -1 when unset.
std::pair<int, int64_t> testMismatchHook() {
  const char* hook = std::getenv("COHORT_TEST_MPI_MISMATCH");
  if (hook == nullptr || *hook == '\0') return {-1, -1};
  int rank = -1;
  long long sequence = -1;
  char rest = 0;
  if (std::sscanf(hook, "%d:%lld%c", &rank, &sequence, &rest) != 2 || rank < 0 || sequence < 0) {
    COHORT_THROW(InvalidArgument) << "COHORT_TEST_MPI_MISMATCH must be RANK:SEQUENCE, got '" << hook << "'";
  }
  return {rank, sequence};
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
  // members: by rank in dataComm (gatherMembers over it).
  MpiState(MpiEnvironment& environment, int rank, int size, MPI_Comm dataComm, MPI_Comm fingerprintComm,
           std::chrono::milliseconds drainTimeout, std::vector<Member> members)
      : environment_(environment),
        rank_(rank),
        size_(size),
        dataComm_(dataComm),
        fingerprintComm_(fingerprintComm),
        drainTimeout_(drainTimeout),
        members_(std::move(members)),
        heartbeat_(fingerprintComm, rank, size) {
    const auto [hookRank, hookSequence] = testMismatchHook();
    if (hookRank >= 0 && hookRank == members_[static_cast<size_t>(rank_)].worldRank) mismatchAt_ = hookSequence;
  }

  ~MpiState() {
    // Collectives nobody waited for are finished first (bounded), so MPI can still be finalised;
    // not once a communicator of this process has failed: its peers may be gone, and waiting out
    // the timeout again would only delay the report of the error (a job with several
    // communicators, such as the hierarchical backend's or the sharded strategy's).
    const Clock::time_point deadline = Clock::now() + drainTimeout_;
    while (!error_ && !environment_.failed() && !pending_.empty() && Clock::now() < deadline) {
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
    if (!heartbeat_.stop()) {
      environment_.markUnclean();
      return;
    }
    MPI_Comm_free(&dataComm_);
    MPI_Comm_free(&fingerprintComm_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }

  // "rank 2 (cohort-node1)": the member at rank commRank of this communicator, by world rank and host.
  std::string describeMember(int commRank) const { return mpi_detail::describeMembers(members_, {commRank}); }
  std::string describeMembers(const std::vector<int>& commRanks) const {
    return mpi_detail::describeMembers(members_, commRanks);
  }

  // Starts a collective in `op`: the previous Op of the caller's Work, reused once MPI is done with
  // it (only the Work still holds it) so that its vectors keep their memory; else a new one.
  void issue(std::shared_ptr<Op>& op, Fingerprint fingerprint, const void* input, void* output) {
    if (error_) std::rethrow_exception(error_);
    if (fingerprint.count > static_cast<uint64_t>(INT_MAX)) {
      COHORT_THROW(InvalidArgument) << "the mpi backend handles at most " << INT_MAX
                                    << " elements per collective (per rank), got " << fingerprint.count;
    }
    fingerprint.sequence = nextSequence_++;
    if (static_cast<int64_t>(fingerprint.sequence) == mismatchAt_) {  // the test hook: fewer elements stay in bounds
      fingerprint.count = fingerprint.count > 0 ? fingerprint.count - 1 : 1;
    }
    if (op == nullptr || op.use_count() > 1) op = std::make_shared<Op>();
    op->phase = Phase::kFingerprints;
    op->dataRequest = MPI_REQUEST_NULL;
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
      heartbeat_.beat(now);
      heartbeat_.poll(now);
      sleep = std::min(std::chrono::microseconds(1000), sleep + std::chrono::microseconds(50));
      std::this_thread::sleep_for(sleep);
    }
    try {
      heartbeat_.poll(Clock::now());
      throwTimeout(op, timeout);
    } catch (...) {
      error_ = std::current_exception();
      abandon();
      // MPI_Finalize is collective in Open MPI (a fence over every process of the job): with a
      // peer gone or cut off it would wait forever, so a rank that timed out exits without it and
      // mpirun ends the job on seeing that.
      environment_.markUnclean();
      throw;
    }
  }

 private:
  bool fingerprintsComplete(Op& op) {
    for (auto* requests : {&op.recvRequests, &op.sendRequests}) {
      for (int peer = 0; peer < size_; ++peer) {
        MPI_Request& request = (*requests)[static_cast<size_t>(peer)];
        if (request == MPI_REQUEST_NULL) continue;
        int done = 0;
        const int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) checkMpi(rc, ("MPI_Test (fingerprint exchange with " + describeMember(peer) + ")").c_str());
      }
    }
    auto complete = [](const std::vector<MPI_Request>& rs) {
      return std::all_of(rs.begin(), rs.end(), [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
    };
    return complete(op.recvRequests) && complete(op.sendRequests);
  }

  // Every rank holds the same table, so every rank builds the same message.
  void checkFingerprints(const Op& op) {
    const Fingerprint first = op.received[0].toFingerprint();
    bool same = true;
    for (int r = 1; r < size_ && same; ++r) same = op.received[r].toFingerprint() == first;
    if (same) return;  // without the table below, which allocates
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
      os << describeMembers(groups[g].second) << " issued " << groups[g].first.str();
    }
    os << " (no data was exchanged)";
    throw InvalidArgument(os.str());
  }

  // Every data collective is one non-blocking MPI call; bf16 reductions run in fp32 (Op::scratch)
  // and are rounded once in testData.
  void startData(Op& op) {
    const Fingerprint& f = op.fingerprint;
    const int count = static_cast<int>(f.count);
    const bool bf16 = f.dtype == runtime::DType::kBF16;
    const size_t n = static_cast<size_t>(size_);
    switch (f.kind) {
      case CollectiveKind::kAllReduce: {
        if (bf16) {  // [0, count): the widened input; [count, 2 count): the fp32 result
          float* wide = atLeast(op.scratch, 2 * f.count);
          widen(op.input, wide, f.count);
          checkMpi(MPI_Iallreduce(wide, wide + f.count, count, MPI_FLOAT, mpiOp(f.op), dataComm_, &op.dataRequest),
                   "MPI_Iallreduce");
          break;
        }
        const bool inPlace = op.input == op.output;
        const void* send = inPlace ? MPI_IN_PLACE : op.input;
        // Open MPI's non-blocking all-reduce in place is always a reduce to one rank and a broadcast
        // (one direction at a time: half the bandwidth between nodes), so a large one sends from a
        // copy and gets the reduce-scatter/all-gather algorithms (GradSync's buckets are in place).
        if (inPlace && f.count * sizeof(float) >= kInPlaceCopyBytes) {
          float* copy = atLeast(op.scratch, f.count);
          std::memcpy(copy, op.output, f.count * sizeof(float));
          send = copy;
        }
        checkMpi(MPI_Iallreduce(send, op.output, count, MPI_FLOAT, mpiOp(f.op), dataComm_, &op.dataRequest),
                 "MPI_Iallreduce");
        break;
      }
      case CollectiveKind::kReduceScatter: {
        // Every rank's chunk r goes to rank r (one exchange, both directions at once), and rank r
        // reduces what it received in rank order (testData). Open MPI's MPI_Ireduce_scatter_block
        // reduces to one rank and scatters, which moves the whole buffer one way first: half the
        // bandwidth across nodes. NCCL's in place needs nothing special: the input is only read
        // by the exchange, and the output written after it. bf16: rows at [0, n count), the widened
        // input after them.
        float* rows = atLeast(op.scratch, (bf16 ? 2 * n : n) * f.count);
        const void* send = op.input;
        if (bf16) {
          widen(op.input, rows + n * f.count, n * f.count);
          send = rows + n * f.count;
        }
        checkMpi(MPI_Ialltoall(send, count, MPI_FLOAT, rows, count, MPI_FLOAT, dataComm_, &op.dataRequest),
                 "MPI_Ialltoall (reduce-scatter)");
        break;
      }
      case CollectiveKind::kAllGather: {
        // NCCL's in place (input == output + rank*count) is MPI's MPI_IN_PLACE for an all-gather.
        const MPI_Datatype type = bf16 ? MPI_UINT16_T : MPI_FLOAT;
        const bool inPlace =
            op.input == static_cast<const char*>(op.output) + static_cast<size_t>(rank_) * f.count * runtime::sizeOf(f.dtype);
        checkMpi(MPI_Iallgather(inPlace ? MPI_IN_PLACE : op.input, count, type, op.output, count, type, dataComm_,
                                &op.dataRequest),
                 "MPI_Iallgather");
        break;
      }
      case CollectiveKind::kBroadcast:
        checkMpi(MPI_Ibcast(op.output, count, bf16 ? MPI_UINT16_T : MPI_FLOAT, f.root, dataComm_, &op.dataRequest),
                 "MPI_Ibcast");
        break;
      case CollectiveKind::kBarrier:
        checkMpi(MPI_Ibarrier(dataComm_, &op.dataRequest), "MPI_Ibarrier");
        break;
    }
    op.phase = Phase::kData;
  }

  void testData(Op& op) {
    int done = 0;
    const int rc = MPI_Test(&op.dataRequest, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) checkMpi(rc, op.fingerprint.str().c_str());  // the text only for the error
    if (!done) return;
    const Fingerprint& f = op.fingerprint;
    if (f.kind == CollectiveKind::kAllReduce || f.kind == CollectiveKind::kReduceScatter) finishReduction(op);
    op.phase = Phase::kDone;
  }

  // The result of an all-reduce or reduce-scatter in fp32 (the output itself, or scratch for bf16),
  // avg's scaling, and bf16's one rounding.
  void finishReduction(Op& op) {
    const Fingerprint& f = op.fingerprint;
    const bool bf16 = f.dtype == runtime::DType::kBF16;
    const size_t n = static_cast<size_t>(size_);
    float* result = bf16 ? op.scratch.data() + f.count : static_cast<float*>(op.output);
    if (f.kind == CollectiveKind::kReduceScatter) {
      // bf16: the rows' sum goes where the widened input was (no longer needed).
      if (bf16) result = op.scratch.data() + n * f.count;
      reduceRows(op.scratch.data(), result, f.count, f.op);
    }
    if (f.op == ReduceOp::kAvg) {
      // avg is float(sum) * float(1/n) in every backend (docs/collectives.md), so a job gives the
      // same bits on shm and mpi; exact when n is a power of two.
      const float scale = 1.0f / static_cast<float>(size_);
      for (uint64_t i = 0; i < f.count; ++i) result[i] *= scale;
    }
    if (bf16) narrow(result, op.output, f.count);
  }

  // output[i] = op over ranks r (in rank order) of rows[r * count + i].
  void reduceRows(const float* rows, float* output, uint64_t count, ReduceOp op) const {
    for (uint64_t i = 0; i < count; ++i) output[i] = rows[i];
    for (int r = 1; r < size_; ++r) {
      const float* row = rows + static_cast<size_t>(r) * count;
      for (uint64_t i = 0; i < count; ++i) {
        switch (op) {
          case ReduceOp::kSum:
          case ReduceOp::kAvg:
            output[i] += row[i];
            break;
          case ReduceOp::kMax:
            output[i] = std::max(output[i], row[i]);
            break;
          case ReduceOp::kMin:
            output[i] = std::min(output[i], row[i]);
            break;
        }
      }
    }
  }

  [[noreturn]] void throwTimeout(const Op& op, std::chrono::milliseconds timeout) {
    // The earliest Op still exchanging fingerprints holds everything after it back; one issued after
    // `op` does not hold `op` (which then waits for its data: below).
    for (const auto& pendingOp : pending_) {
      if (pendingOp->phase != Phase::kFingerprints) {
        if (pendingOp.get() == &op) break;
        continue;
      }
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
        os << describeMembers(missing) << " did not arrive within " << describeDuration(timeout);
      throw TimeoutError(os.str());
    }
    // Every waiting rank beats every kHeartbeatInterval (mpi_heartbeat.h): who was silent for the
    // second half of the wait is what holds the transfer up. Too short a wait says nothing.
    std::vector<int> silent;
    if (timeout >= 8 * Heartbeat::kHeartbeatInterval) silent = heartbeat_.silentSince(Clock::now() - timeout / 2);
    std::ostringstream os;
    os << "collective " << op.fingerprint.str() << ": every rank arrived, but MPI did not finish the data transfer within "
       << describeDuration(timeout);
    if (!silent.empty()) {
      os << ": nothing heard from " << describeMembers(silent) << " for " << describeDuration(timeout / 2)
         << " (gone, cut off, or not calling into MPI)";
    }
    throw TimeoutError(os.str());
  }

  // After an error: cancel the fingerprint receives nobody will complete; any request that
  // cannot be finished keeps MPI_Finalize from running at exit (it could hang on it).
  void abandon() {
    environment_.markFailed();
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
    if (!heartbeat_.stop()) clean = false;
    if (!clean) environment_.markUnclean();
  }

  MpiEnvironment& environment_;
  int rank_;
  int size_;
  MPI_Comm dataComm_;
  MPI_Comm fingerprintComm_;
  std::chrono::milliseconds drainTimeout_;  // how long the destructor finishes unwaited collectives
  std::vector<Member> members_;             // by rank in dataComm_
  Heartbeat heartbeat_;                     // on fingerprintComm_, beating only in long waits
  int64_t mismatchAt_ = -1;                 // COHORT_TEST_MPI_MISMATCH's sequence for this rank
  uint64_t nextSequence_ = 0;
  std::vector<std::shared_ptr<Op>> pending_;  // issue order
  std::exception_ptr error_;
};

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

 private:
  WorkPtr start(const Fingerprint& fingerprint, const void* input, void* output) {
    PooledPtr<MpiWork> work = pool_.acquire(state_);
    work->start(fingerprint, input, output);
    return work;
  }

  std::shared_ptr<MpiState> state_;
  WorkPool<MpiWork> pool_;  // its idle Works hold state_ too; Works in use free themselves
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

// The members of the world with `color` (MPI_Comm_split of a bounded duplicate, so every rank is
// known to have arrived before the blocking split); color < 0: the whole world.
MPI_Comm duplicateMembers(int color, int worldRank, std::chrono::milliseconds timeout, const char* purpose) {
  MPI_Comm world = duplicateWorld(timeout, purpose);
  if (color < 0) return world;
  MPI_Comm members = MPI_COMM_NULL;
  checkMpi(MPI_Comm_split(world, color, worldRank, &members), "MPI_Comm_split");
  checkMpi(MPI_Comm_free(&world), "MPI_Comm_free");
  checkMpi(MPI_Comm_set_errhandler(members, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  return members;
}

std::unique_ptr<Communicator> makeMembersCommunicator(const CommunicatorOptions& options, int color) {
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
  MPI_Comm dataComm = duplicateMembers(color, rank, options.timeout, "data");
  MPI_Comm fingerprintComm = duplicateMembers(color, rank, options.timeout, "fingerprints");
  checkMpi(MPI_Comm_rank(dataComm, &rank), "MPI_Comm_rank");
  checkMpi(MPI_Comm_size(dataComm, &size), "MPI_Comm_size");
  return std::make_unique<MpiCommunicator>(
      std::make_shared<MpiState>(environment, rank, size, dataComm, fingerprintComm, options.timeout,
                                 gatherMembers(dataComm, options.world.rank, options.timeout)));
}

}  // namespace

std::unique_ptr<Communicator> makeMpiCommunicator(const CommunicatorOptions& options) {
  return makeMembersCommunicator(options, -1);
}

std::unique_ptr<Communicator> makeMpiCommunicator(const CommunicatorOptions& options, int color) {
  if (color < 0) COHORT_THROW(InvalidArgument) << "makeMpiCommunicator: color " << color << " is negative";
  return makeMembersCommunicator(options, color);
}

}  // namespace cohort::collectives
