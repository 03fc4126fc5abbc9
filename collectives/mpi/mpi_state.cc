// MpiState: what an mpi communicator and its Works share (mpi_state.h).
#include "collectives/mpi/mpi_state.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "runtime/error.h"

namespace cohort::collectives::mpi_detail {

using Clock = std::chrono::steady_clock;

namespace {
constexpr int kFingerprintTag = 7;
}  // namespace

std::string describeDuration(std::chrono::milliseconds timeout) {
  std::ostringstream os;
  if (timeout.count() % 1000 == 0)
    os << timeout.count() / 1000 << " s";
  else
    os << timeout.count() << " ms";
  return os.str();
}

MpiState::MpiState(MpiEnvironment& environment, MPI_Comm dataComm, MPI_Comm fingerprintComm, const Options& options)
    : environment_(environment), dataComm_(dataComm), fingerprintComm_(fingerprintComm), options_(options) {
  checkMpi(MPI_Comm_rank(dataComm, &rank_), "MPI_Comm_rank");
  checkMpi(MPI_Comm_size(dataComm, &size_), "MPI_Comm_size");
  members_ = gatherMembers(dataComm, options.worldRank, options.timeout);
  heartbeat_.emplace(fingerprintComm, rank_, size_);
  if (options.faultInjection.rank >= 0 && options.faultInjection.rank == options.worldRank) {
    mismatchAt_ = options.faultInjection.mismatchAt;
  }
}

MpiState::~MpiState() {
  // Collectives nobody waited for are finished first (bounded), so MPI can still be finalised;
  // not once a communicator of this process has failed: its peers may be gone, and waiting out
  // the timeout again would only delay the report of the error (a job with several
  // communicators, such as the hierarchical backend's or the sharded strategy's).
  const Clock::time_point deadline = Clock::now() + options_.timeout;
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
  if (!heartbeat_->stop()) {
    environment_.markUnclean();
    return;
  }
  MPI_Comm_free(&dataComm_);
  MPI_Comm_free(&fingerprintComm_);
}

// Starts a collective in `op`: the previous Op of the caller's Work, reused once MPI is done with
// it (only the Work still holds it) so that its vectors keep their memory; else a new one.
void MpiState::issue(std::shared_ptr<Op>& op, Fingerprint fingerprint, const void* input, void* output) {
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
    checkMpi(MPI_Irecv(&op->received[peer], sizeof(WireFingerprint), MPI_BYTE, peer, kFingerprintTag, fingerprintComm_,
                       &op->recvRequests[peer]),
             "MPI_Irecv (fingerprint)");
    checkMpi(MPI_Isend(&op->sent, sizeof(WireFingerprint), MPI_BYTE, peer, kFingerprintTag, fingerprintComm_,
                       &op->sendRequests[peer]),
             "MPI_Isend (fingerprint)");
  }
  pending_.push_back(op);
  progress();
}

// Advances every pending Op as far as it can go without blocking. Rethrows the poisoning error.
void MpiState::progress() {
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

void MpiState::wait(Op& op, std::chrono::milliseconds timeout) {
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
    heartbeat_->beat(now);
    heartbeat_->poll(now);
    sleep = std::min(std::chrono::microseconds(1000), sleep + std::chrono::microseconds(50));
    std::this_thread::sleep_for(sleep);
  }
  try {
    heartbeat_->poll(Clock::now());
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

bool MpiState::fingerprintsComplete(Op& op) {
  for (auto* requests : {&op.recvRequests, &op.sendRequests}) {
    for (int peer = 0; peer < size_; ++peer) {
      MPI_Request& request = (*requests)[static_cast<size_t>(peer)];
      if (request == MPI_REQUEST_NULL) continue;
      int done = 0;
      const int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        checkMpi(rc, ("MPI_Test (fingerprint exchange with " + describeMember(peer) + ")").c_str());
    }
  }
  auto complete = [](const std::vector<MPI_Request>& rs) {
    return std::all_of(rs.begin(), rs.end(), [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
  };
  return complete(op.recvRequests) && complete(op.sendRequests);
}

// Every rank holds the same table, so every rank builds the same message.
void MpiState::checkFingerprints(const Op& op) {
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

void MpiState::throwTimeout(const Op& op, std::chrono::milliseconds timeout) {
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
  if (timeout >= 8 * Heartbeat::kHeartbeatInterval) silent = heartbeat_->silentSince(Clock::now() - timeout / 2);
  std::ostringstream os;
  os << "collective " << op.fingerprint.str()
     << ": every rank arrived, but MPI did not finish the data transfer within " << describeDuration(timeout);
  if (!silent.empty()) {
    os << ": nothing heard from " << describeMembers(silent) << " for " << describeDuration(timeout / 2)
       << " (gone, cut off, or not calling into MPI)";
  }
  throw TimeoutError(os.str());
}

// After an error: cancel the fingerprint receives nobody will complete; any request that
// cannot be finished keeps MPI_Finalize from running at exit (it could hang on it).
void MpiState::abandon() {
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
  if (!heartbeat_->stop()) clean = false;
  if (!clean) environment_.markUnclean();
}

}  // namespace cohort::collectives::mpi_detail
