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
  StagedShardWrite staged{.path = write.path, .generation = write.generation, .metadata = write.metadata};
  for (const NamedTensor& t : write.shards) {
    if (!t.tensor.defined() || !t.tensor.device().isCpu() || static_cast<size_t>(t.tensor.numel()) != map_.shardNumel()) {
      COHORT_THROW(InvalidArgument) << write.path << ": shard '" << t.name << "' must be a CPU tensor of "
                                    << map_.shardNumel() << " elements (copy a GPU shard to the host first)";
    }
    staged.names.push_back(t.name);
  }
  staged.stage = [&](const std::vector<float*>& staging) {
    const size_t bytes = map_.shardNumel() * sizeof(float);
    for (size_t i = 0; i < staging.size() && bytes > 0; ++i) std::memcpy(staging[i], write.shards[i].tensor.data(), bytes);
  };
  submitStaged(staged);
}

void AsyncShardWriter::submitStaged(const StagedShardWrite& write) {
  if (!write.stage) COHORT_THROW(InvalidArgument) << write.path << ": a staged shard write needs its stage function";
  std::unique_lock<std::mutex> lock(mutex_);
  waitIdle(lock, "the previous shard write has not finished");
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  done_.reset();
  // The thread is idle, so staging_ is ours until job_ is set. Allocated zeroed once, so that the
  // padding a stage function never writes stays zero.
  const auto shape = runtime::Shape{static_cast<int64_t>(map_.shardNumel())};
  runtime::Allocator& allocator = options_.stagingAllocator ? *options_.stagingAllocator : runtime::cpuAllocator();
  while (staging_.size() < write.names.size()) staging_.push_back(runtime::Tensor::zeros(shape, allocator));
  Job job{.write = {.path = write.path, .generation = write.generation, .metadata = write.metadata},
          .file = shardFilePath(write.path, write.generation, map_.rank(), map_.worldSize()),
          .ready = write.ready};
  std::vector<float*> buffers;
  for (size_t i = 0; i < write.names.size(); ++i) {
    buffers.push_back(staging_[i].data());
    job.write.shards.push_back({write.names[i], staging_[i]});
  }
  write.stage(buffers);
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
  for (const runtime::Tensor& stage : staging_) bytes += stage.bytes();
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
      if (job.ready) job.ready();
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
