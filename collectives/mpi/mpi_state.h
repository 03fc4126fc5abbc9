// MpiState: the engine of the Open MPI backend, which an mpi communicator and its Works share (Works
// keep it alive). How one collective runs (docs/collectives.md, "MPI backend"):
//
//  1. issue: the Op gets the next sequence number and its Fingerprint. On the fingerprint
//     communicator (a duplicate of the data communicator, so these messages never meet user
//     traffic) it posts one MPI_Irecv per peer and one MPI_Isend of its own fingerprint per peer, all
//     with the same tag: MPI keeps messages between two ranks on one tag in order, so the k-th
//     fingerprint a rank receives from a peer is that peer's k-th collective even when sequences
//     diverge.
//  2. progress (run by every issue, done() and wait()): Ops leave the fingerprint phase strictly in
//     issue order. When all of an Op's fingerprint requests are complete, every rank holds every
//     rank's fingerprint, so every rank reaches the same verdict: a mismatch throws the same
//     InvalidArgument on all ranks and the data collective is never started; a match starts the
//     non-blocking MPI collective (MPI_Iallreduce, ...) on the data communicator (mpi_data.cc).
//  3. the data request is polled with MPI_Test; avg scales the sum by float(1/n) when it completes.
// wait(timeout) polls progress with a backoff (spin, then yield, then short sleeps). When it runs
// out it names the ranks whose fingerprints are missing, or says that MPI itself did not finish.
// Any error poisons the state: every later wait() rethrows it.
// Ownership: owns its two MPI communicators (freed by the destructor once nothing is pending).
// Thread safety: one thread at a time (the communicator's issuing thread).
#pragma once

#include <openmpi/mpi.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/mpi/mpi_environment.h"
#include "collectives/mpi/mpi_fingerprint.h"
#include "collectives/mpi/mpi_heartbeat.h"
#include "collectives/mpi/mpi_members.h"

namespace cohort::collectives::mpi_detail {

// "3 s", "250 ms".
std::string describeDuration(std::chrono::milliseconds timeout);

enum class Phase { kFingerprints, kData, kDone };

// One collective in flight: its fingerprint exchange, its data request and its working space.
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

class MpiState {
 public:
  struct Options {
    int worldRank = 0;                  // this process in MPI_COMM_WORLD (for messages)
    std::chrono::milliseconds timeout;  // set-up, and how long the destructor finishes unwaited collectives
    CommunicatorOptions::FaultInjection faultInjection;
  };
  // Takes ownership of dataComm and fingerprintComm (over the same ranks, MPI_ERRORS_RETURN);
  // collective over them: gathers who every member is (gatherMembers, bounded by options.timeout).
  MpiState(MpiEnvironment& environment, MPI_Comm dataComm, MPI_Comm fingerprintComm, const Options& options);
  ~MpiState();
  MpiState(const MpiState&) = delete;
  MpiState& operator=(const MpiState&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Options& options() const { return options_; }
  MpiEnvironment& environment() const { return environment_; }
  MPI_Comm dataComm() const { return dataComm_; }
  MPI_Comm fingerprintComm() const { return fingerprintComm_; }

  // "rank 2 (cohort-node1)": the member at rank commRank of this communicator, by world rank and host.
  std::string describeMember(int commRank) const { return describeMembers({commRank}); }
  std::string describeMembers(const std::vector<int>& commRanks) const {
    return mpi_detail::describeMembers(members_, commRanks);
  }

  // Starts a collective in `op`: the previous Op of the caller's Work, reused once MPI is done with
  // it (only the Work still holds it) so that its vectors keep their memory; else a new one.
  void issue(std::shared_ptr<Op>& op, Fingerprint fingerprint, const void* input, void* output);
  // Advances every pending Op as far as it can go without blocking. Rethrows the poisoning error.
  void progress();
  // Until `op` is done; TimeoutError naming who is missing when `timeout` runs out.
  void wait(Op& op, std::chrono::milliseconds timeout);

 private:
  bool fingerprintsComplete(Op& op);
  void checkFingerprints(const Op& op);
  // mpi_data.cc:
  void startData(Op& op);
  void testData(Op& op);
  void finishReduction(Op& op);
  void reduceRows(float* rows, float* output, uint64_t count, ReduceOp op) const;
  [[noreturn]] void throwTimeout(const Op& op, std::chrono::milliseconds timeout);
  void abandon();

  MpiEnvironment& environment_;
  int rank_ = 0;
  int size_ = 1;
  MPI_Comm dataComm_;
  MPI_Comm fingerprintComm_;
  const Options options_;
  std::vector<Member> members_;         // by rank in dataComm_
  std::optional<Heartbeat> heartbeat_;  // on fingerprintComm_, beating only in long waits
  int64_t mismatchAt_ = -1;             // options.faultInjection's sequence, for this rank
  uint64_t nextSequence_ = 0;
  std::vector<std::shared_ptr<Op>> pending_;  // issue order
  std::exception_ptr error_;
};

}  // namespace cohort::collectives::mpi_detail
