// AsyncShardWriter: writes a rank's shard file (nn/sharded_checkpoint.h, writeShardFile) on a
// background thread, so that training continues while the bytes go to the disk.
//
// submit() copies the caller's shard tensors into staging memory the writer owns and returns; the
// writer's one thread then writes the file. The copy is taken inside submit(), so whatever the
// caller changes afterwards (the next step's parameters) never reaches the file. At most one write
// is in flight: submit() first waits for the previous one (up to options.timeout, else TimeoutError
// naming its file), so staging holds one checkpoint's shard, allocated at the first submit and reused
// (stagingBytes()). submit() takes CPU tensors. submitStaged() lets the caller fill the staging
// itself: a GPU's shard is copied into it by cudaMemcpyAsync on the stream that computes it
// (options.stagingAllocator: pinned host memory), and the writer's thread calls the write's `ready`,
// which waits for those copies (an event), before it writes: the copies are ordered before any
// later kernel on that stream, so what training changes after them never reaches the file.
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
#include "runtime/allocator.h"
#include "runtime/tensor.h"

namespace cohort::nn {

struct AsyncShardWriterOptions {
  // How long submit() waits for the write in flight, and wait() for it to end.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // Called on the writer's thread with the shard file's path before each write (tests, tracing).
  std::function<void(const std::string&)> beforeWrite = {};
  // Where the staging is allocated (nullptr: the CPU's allocator); it must be host memory. Pinned
  // memory (runtime::cuda::PinnedHostAllocator) lets a device's copy into it run asynchronously.
  runtime::Allocator* stagingAllocator = nullptr;
};

// A write whose bytes the caller puts into the writer's staging itself (submitStaged).
struct StagedShardWrite {
  std::string path = {};
  uint64_t generation = 0;
  std::vector<std::string> names = {};  // the shards' names, in order
  Metadata metadata = {};
  // Called once inside submitStaged, on the caller's thread, with one staging buffer per name
  // (map.shardNumel() floats of host memory each, zero where nothing was ever written): fills them,
  // or only starts copies into them that `ready` waits for.
  std::function<void(const std::vector<float*>& staging)> stage = {};
  // Called on the writer's thread before the write; returns once the staging holds every byte
  // (e.g. waits, bounded, for the event recorded after a device's copies), or throws: the write's
  // error. Empty: `stage` filled it.
  std::function<void()> ready = {};
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
  // Waits for the write in flight as submit() does, then has `write.stage` fill the staging and
  // starts the write. InvalidArgument, before waiting, for a write without `stage`.
  void submitStaged(const StagedShardWrite& write);
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
    std::function<void()> ready;  // StagedShardWrite::ready
  };
  void run();
  void waitIdle(std::unique_lock<std::mutex>& lock, const char* what);

  const ShardMap map_;
  const AsyncShardWriterOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<runtime::Tensor> staging_;  // the thread's while a job is in flight
  std::optional<Job> job_;                   // submitted or being written
  std::optional<ShardFile> done_;            // the last write's file, until wait() takes it
  std::exception_ptr error_;                 // the last write's error, until wait() or submit() takes it
  bool stop_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace cohort::nn
