#include "collectives/mpi/mpi_heartbeat.h"

#include <algorithm>
#include <mutex>

#include "collectives/mpi/mpi_environment.h"

namespace cohort::collectives::mpi_detail {

namespace {

// The process's Heartbeats that have not stopped.
struct Live {
  std::mutex mutex;
  std::vector<Heartbeat*> heartbeats;
};
Live& live() {
  static Live* l = new Live;  // never destroyed: a Heartbeat may stop during static destruction
  return *l;
}

}  // namespace

Heartbeat::Heartbeat(MPI_Comm comm, int rank, int size)
    : comm_(comm),
      rank_(rank),
      size_(size),
      receives_(static_cast<size_t>(size), MPI_REQUEST_NULL),
      sends_(static_cast<size_t>(size), MPI_REQUEST_NULL),
      incoming_(static_cast<size_t>(size), 0),
      lastHeard_(static_cast<size_t>(size)) {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    checkMpi(MPI_Irecv(&incoming_[peer], 1, MPI_BYTE, peer, kTag, comm_, &receives_[peer]), "MPI_Irecv (heartbeat)");
  }
  std::lock_guard lock(live().mutex);
  live().heartbeats.push_back(this);
}

Heartbeat::~Heartbeat() {
  if (!stopped_ && !stop()) MpiEnvironment::acquire().markUnclean();
}

void Heartbeat::beat(Clock::time_point now) {
  std::lock_guard lock(live().mutex);
  for (Heartbeat* heartbeat : live().heartbeats) heartbeat->beatPeers(now);
}

void Heartbeat::beatPeers(Clock::time_point now) {
  if (stopped_ || now - lastBeat_ < kHeartbeatInterval) return;
  lastBeat_ = now;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    MPI_Request& send = sends_[peer];
    int done = 1;
    if (send != MPI_REQUEST_NULL) checkMpi(MPI_Test(&send, &done, MPI_STATUS_IGNORE), "MPI_Test (heartbeat)");
    // A beat still queued to a peer that is not receiving is not joined by another.
    if (done) checkMpi(MPI_Isend(&outgoing_, 1, MPI_BYTE, peer, kTag, comm_, &send), "MPI_Isend (heartbeat)");
  }
}

void Heartbeat::poll(Clock::time_point now) {
  if (stopped_) return;
  for (int peer = 0; peer < size_; ++peer) {
    for (MPI_Request& receive = receives_[peer]; receive != MPI_REQUEST_NULL;) {
      int done = 0;
      checkMpi(MPI_Test(&receive, &done, MPI_STATUS_IGNORE), "MPI_Test (heartbeat)");
      if (!done) break;
      lastHeard_[peer] = now;
      checkMpi(MPI_Irecv(&incoming_[peer], 1, MPI_BYTE, peer, kTag, comm_, &receive), "MPI_Irecv (heartbeat)");
    }
  }
}

std::vector<int> Heartbeat::silentSince(Clock::time_point since) const {
  std::vector<int> silent;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_ && lastHeard_[peer] < since) silent.push_back(peer);
  }
  return silent;
}

bool Heartbeat::stop() {
  {
    // Off the list first: no other thread's beat() touches the sends after this.
    std::lock_guard lock(live().mutex);
    if (stopped_) return true;
    stopped_ = true;
    auto& all = live().heartbeats;
    all.erase(std::remove(all.begin(), all.end(), this), all.end());
  }
  bool clean = true;
  for (MPI_Request& receive : receives_) {
    if (receive == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&receive);
    int done = 0;
    MPI_Test(&receive, &done, MPI_STATUS_IGNORE);
    if (!done) clean = false;
  }
  // A one-byte send to a live peer completes at once (eager); one to a peer that is gone never does.
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(100);
  for (MPI_Request& send : sends_) {
    int done = send == MPI_REQUEST_NULL;
    while (!done && MPI_Test(&send, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done && Clock::now() < deadline) {
    }
    if (!done) clean = false;
  }
  return clean;
}

}  // namespace cohort::collectives::mpi_detail
