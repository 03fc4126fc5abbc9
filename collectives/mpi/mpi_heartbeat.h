// Heartbeat: which peers of an MPI communicator are still there while this rank waits for a
// collective, so that a data transfer that does not finish names the ranks it is missing.
//
// Once a collective's fingerprints have arrived, MPI moves its data and says nothing about who is
// holding it up. While a wait is long (beat() is called only from the sleeping part of the mpi
// backend's wait loop), every waiting rank sends a one-byte message to every peer every
// kHeartbeatInterval; poll() receives them. A peer that was not heard from for a while is gone (its
// process died or its node was cut off) or is not calling into MPI; the peers waiting beside this
// rank are heard from. Messages go on the communicator given (the backend's fingerprint
// communicator) with their own tag, so they never meet a fingerprint. Healthy jobs with short waits
// send none.
// Beats are per process: beat() beats on every Heartbeat of the process (every mpi communicator it
// has), so a rank waiting on one communicator is heard on the others too. A job that waits on
// several (one shared copy per node across nodes: the world, and each local rank's cross-node
// group) then names only the ranks that stopped answering, not those waiting elsewhere.
//
// Ownership: holds one posted receive per peer (and at most one send per peer) on the communicator,
// which must outlive it; stop() cancels and completes them, and must run before the communicator is
// freed. Thread safety: poll(), silentSince() and stop() from the communicator's issuing thread;
// beat() from any thread (the process's Heartbeats are listed under a mutex).
//
//   Heartbeat heartbeat(comm, rank, size);
//   heartbeat.beat(now); heartbeat.poll(now);                 // in a wait loop
//   std::vector<int> gone = heartbeat.silentSince(now - 5s);  // when the wait runs out
#pragma once

#include <openmpi/mpi.h>

#include <chrono>
#include <cstdint>
#include <vector>

namespace cohort::collectives::mpi_detail {

class Heartbeat {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kHeartbeatInterval{250};
  static constexpr int kTag = 8;  // the fingerprints' is 7

  // Posts a receive from every peer (PeerError when MPI refuses).
  Heartbeat(MPI_Comm comm, int rank, int size);
  ~Heartbeat();  // stop(), if not called yet
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // On every Heartbeat of this process: sends a beat to every peer whose previous one has gone, at
  // most once per kHeartbeatInterval.
  void beat(Clock::time_point now);
  // Receives every beat that has arrived (reposting the receives) and notes when.
  void poll(Clock::time_point now);
  // The peers (ranks in the communicator) not heard from since `since`.
  std::vector<int> silentSince(Clock::time_point since) const;
  // Cancels the receives and completes what can be completed; false when a request is left
  // unfinished (then MPI_Finalize must not run). Idempotent.
  bool stop();

 private:
  void beatPeers(Clock::time_point now);  // this one's peers; under the list's mutex

  MPI_Comm comm_;
  int rank_;
  int size_;
  std::vector<MPI_Request> receives_;  // by peer; MPI_REQUEST_NULL for self and once stopped
  std::vector<MPI_Request> sends_;
  std::vector<uint8_t> incoming_;
  uint8_t outgoing_ = 1;
  std::vector<Clock::time_point> lastHeard_;  // by peer; the epoch when never
  Clock::time_point lastBeat_{};
  bool stopped_ = false;
};

}  // namespace cohort::collectives::mpi_detail
