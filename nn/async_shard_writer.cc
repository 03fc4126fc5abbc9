#include "nn/async_shard_writer.h"

#include <cstdio>
#include <cstring>
#include <utility>

#include "runtime/error.h"
#include "runtime/timeout.h"

namespace cohort::nn {

AsyncShardWriter::AsyncShardWriter(ShardMap map, AsyncShardWriterOptions options)
    : map_(std::move(map)), options_(std::move(options)), thread_([this] { run(); }) {}

AsyncShardWriter::~AsyncShardWriter() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();  // after the write in flight: staging_ is its memory
  if (!error_) return;
  try {
    std::rethrow_exception(error_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint shard write failed and nobody waited for it: %s\n", e.what());
  }
}

void AsyncShardWriter::waitIdle(std::unique_lock<std::mutex>& lock, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + runtime::saturateTimeout(options_.timeout);
  if (!changed_.wait_until(lock, deadline, [&] { return !job_.has_value(); })) {
    COHORT_THROW(TimeoutError) << job_->file << ": " << what << " after " << options_.timeout.count()
                               << " ms: the shard file is still being written";
  }
}

void AsyncShardWriter::submit(const ShardWrite& write) {
  for (const NamedTensor& t : write.shards) {
    if (!t.tensor.defined() || !t.tensor.device().isCpu() || static_cast<size_t>(t.tensor.numel()) != map_.shardNumel()) {
      COHORT_THROW(InvalidArgument) << write.path << ": shard '" << t.name << "' must be a CPU tensor of "
                                    << map_.shardNumel() << " elements (copy a GPU shard to the host first)";
    }
  }
  std::unique_lock<std::mutex> lock(mutex_);
  waitIdle(lock, "the previous shard write has not finished");
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  done_.reset();
  // The thread is idle, so staging_ is ours until job_ is set.
  staging_.resize(write.shards.size());
  Job job{.write = {.path = write.path, .generation = write.generation, .metadata = write.metadata},
          .file = shardFilePath(write.path, write.generation, map_.rank(), map_.worldSize())};
  for (size_t i = 0; i < write.shards.size(); ++i) {
    std::vector<float>& stage = staging_[i];
    stage.resize(map_.shardNumel());
    if (!stage.empty()) std::memcpy(stage.data(), write.shards[i].tensor.data(), stage.size() * sizeof(float));
    job.write.shards.push_back(
        {write.shards[i].name, runtime::Tensor::view(stage.data(), {static_cast<int64_t>(stage.size())})});
  }
  job_ = std::move(job);
  lock.unlock();
  changed_.notify_all();
}

std::optional<ShardFile> AsyncShardWriter::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  waitIdle(lock, "waited for the shard write");
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return std::exchange(done_, std::nullopt);
}

bool AsyncShardWriter::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return job_.has_value();
}

size_t AsyncShardWriter::stagingBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t bytes = 0;
  for (const std::vector<float>& stage : staging_) bytes += stage.capacity() * sizeof(float);
  return bytes;
}

void AsyncShardWriter::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stop_ || job_.has_value(); });
    if (!job_) return;  // stopping, nothing in flight
    const Job& job = *job_;
    lock.unlock();
    std::optional<ShardFile> file;
    std::exception_ptr error;
    try {
      if (options_.beforeWrite) options_.beforeWrite(job.file);
      file = writeShardFile(map_, job.write);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    done_ = std::move(file);
    error_ = error;
    job_.reset();
    changed_.notify_all();
  }
}

}  // namespace cohort::nn
