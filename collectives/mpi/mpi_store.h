// MpiStore: the rendezvous Store (collectives/store.h) for jobs that span nodes, over Open MPI.
//
// Rank 0 of MPI_COMM_WORLD holds the table; a service thread there answers the other ranks'
// requests (set, which keys are missing, get, goodbye) on a private duplicate of MPI_COMM_WORLD,
// so the store never mixes with the job's collectives. Other ranks send one request at a time and
// poll for the answer with a deadline (every wait bounded: TimeoutError naming rank 0 or the keys).
// wait() and get() poll the missing keys with ipc::Backoff, as FileStore does.
//
// Construction and destruction are collective over MPI_COMM_WORLD: every rank constructs one
// MpiStore and destroys it; rank 0 keeps serving until every other rank has said goodbye (or the
// timeout passed), so a rank can still read what the others set after it finished itself.
// Needs MPI initialised with MPI_THREAD_MULTIPLE (MpiEnvironment asks for it); InvalidArgument
// naming the level otherwise.
// Thread safety: set/get/wait/check may be called from several threads of one process.
//
//   collectives::MpiStore store;                              // every rank
//   if (rank == 0) store.set("nccl-id", idBytes);
//   auto id = store.get("nccl-id", std::chrono::seconds(60));  // every rank
#pragma once

#include <chrono>
#include <memory>

#include "collectives/store.h"

namespace cohort::collectives {

class MpiStore final : public Store {
 public:
  // `timeout` bounds the set-up, each request's round trip and rank 0's wait for the goodbyes.
  explicit MpiStore(std::chrono::milliseconds timeout = std::chrono::seconds(300));
  ~MpiStore() override;
  MpiStore(const MpiStore&) = delete;
  MpiStore& operator=(const MpiStore&) = delete;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cohort::collectives
