// AsyncShardWriter: writes a rank's shard file (nn/sharded_checkpoint.h, writeShardFile) on a
// background thread, so that training continues while the bytes go to the disk.
//
// submit() copies the caller's shard tensors into staging memory the writer owns and returns; the
// writer's one thread then writes the file. The copy is taken inside submit(), so whatever the
// caller changes afterwards (the next step's parameters) never reaches the file. At most one write
// is in flight: submit() first waits for the previous one (up to options.timeout, else TimeoutError
// naming its file), so staging holds one checkpoint's shard, allocated at the first submit and reused
// (stagingBytes()). Tensors must be on the CPU: on a GPU, copy device to host first.
// Errors are never dropped: wait() rethrows the write's error (IoError, InvalidArgument) on the
// calling thread, and a submit() that finds the previous write failed and not yet waited for
// rethrows that error instead of taking its own write. The destructor waits for the write in flight
// and never throws; an error nobody waited for is printed to stderr, one line.
//
// Ownership: owns its thread and staging memory; the map is copied. Thread safety: submit() and
// wait() from one thread at a time (the training loop); stagingBytes() and busy() from any.
//
//   nn::AsyncShardWriter writer(map);
//   writer.submit({.path = p, .generation = g, .shards = {{"params", shard}}});  // training goes on
//   nn::ShardFile file = *writer.wait();  // durable; then the barrier and the commit
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "nn/sharded_checkpoint.h"

namespace cohort::nn {

struct AsyncShardWriterOptions {
  // How long submit() waits for the write in flight, and wait() for it to end.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // Called on the writer's thread with the shard file's path before each write (tests, tracing).
  std::function<void(const std::string&)> beforeWrite = {};
};

class AsyncShardWriter {
 public:
  explicit AsyncShardWriter(ShardMap map, AsyncShardWriterOptions options = {});
  ~AsyncShardWriter();
  AsyncShardWriter(const AsyncShardWriter&) = delete;
  AsyncShardWriter& operator=(const AsyncShardWriter&) = delete;

  // Stages `write`'s shards and starts writing them (above). InvalidArgument, before waiting, for a
  // tensor not on the CPU or of another size than map.shardNumel().
  void submit(const ShardWrite& write);
  // Waits until the last submitted write is durable and returns its file, or rethrows its error;
  // nullopt when nothing was submitted since the last wait(). TimeoutError naming the file after
  // options.timeout (the write goes on; wait again).
  std::optional<ShardFile> wait();

  bool busy() const;
  size_t stagingBytes() const;

 private:
  struct Job {
    ShardWrite write;  // shards are views of staging_
    std::string file;
  };
  void run();
  void waitIdle(std::unique_lock<std::mutex>& lock, const char* what);

  const ShardMap map_;
  const AsyncShardWriterOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::vector<float>> staging_;  // the thread's while a job is in flight
  std::optional<Job> job_;                   // submitted or being written
  std::optional<ShardFile> done_;            // the last write's file, until wait() takes it
  std::exception_ptr error_;                 // the last write's error, until wait() or submit() takes it
  bool stop_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace cohort::nn
