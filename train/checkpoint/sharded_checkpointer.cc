#include "train/checkpoint/sharded_checkpointer.h"

#include <algorithm>

#include "runtime/error.h"
#include "train/checkpoint/checkpointer.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/pinned_allocator.h"
#endif

namespace cohort::train {

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

const nn::NamedTensor* findNamed(const std::vector<nn::NamedTensor>& tensors, const std::string& name) {
  auto it = std::find_if(tensors.begin(), tensors.end(), [&](const nn::NamedTensor& t) { return t.name == name; });
  return it == tensors.end() ? nullptr : &*it;
}

}  // namespace

// A checkpoint saved and not yet committed. Every rank holds the path, generation, tensor names and
// metadata; rank 0 also the buffers' copies, which go into the manifest.
struct ShardedCheckpointer::Pending {
  std::string path;
  uint64_t generation = 0;
  bool async = false;
  std::vector<std::string> tensors;      // the shard files' tensors, in order
  nn::Metadata metadata;                 // the manifest's
  std::vector<nn::NamedTensor> buffers;  // rank 0: the model's buffers as they were at the save
  // GPU: recorded on the compute stream after this save's copies to the host (the shard's and the
  // buffers'); shared with the writer's thread, which waits for it before it writes.
  std::shared_ptr<runtime::Event> copied = std::make_shared<runtime::Event>();
  std::optional<nn::ShardFile> file;     // a synchronous write's result
  std::exception_ptr error;              // this rank's failure to write or stage
  Clock::time_point start;
  double stagedSeconds = 0;
};

ShardedCheckpointer::ShardedCheckpointer(const Context& c)
    : placement_(c.placement),
      collectives_(c.collectives),
      params_(c.params),
      optimizer_(c.optimizer),
      world_(c.world),
      timeout_(c.timeout) {
#ifdef COHORT_HAVE_CUDA
  if (placement_.memory().onGpu()) pinned_ = std::make_unique<runtime::cuda::PinnedHostAllocator>();
#endif
}

// The writer's destructor waits for a write in flight; an uncommitted checkpoint stays uncommitted.
ShardedCheckpointer::~ShardedCheckpointer() = default;

void ShardedCheckpointer::agreeOnFailure(std::exception_ptr problem, const std::string& what) {
  std::vector<double> failed(static_cast<size_t>(world_.worldSize), 0.0);
  if (problem) failed[static_cast<size_t>(world_.rank)] = 1;
  collectives_.reduce(failed, ScalarOp::kSum);
  if (problem) std::rethrow_exception(problem);
  for (size_t r = 0; r < failed.size(); ++r) {
    if (failed[r] != 0) COHORT_THROW(IoError) << what << ": rank " << r << " failed (its message says why)";
  }
}

uint64_t ShardedCheckpointer::agreedGeneration(const std::string& path) {
  std::exception_ptr problem;
  double next = 0;
  try {
    next = static_cast<double>(nn::nextShardGeneration(path));
  } catch (...) {
    problem = std::current_exception();
  }
  agreeOnFailure(problem, path + ": reading the committed checkpoint");
  collectives_.reduce({&next, 1}, ScalarOp::kMax);
  return static_cast<uint64_t>(next);
}

void ShardedCheckpointer::save(const std::string& path, const nn::Metadata& metadata, const SaveOptions& options) {
  settle({.wait = true});  // one checkpoint in flight at most
  auto pending = std::make_unique<Pending>();
  pending->start = Clock::now();
  pending->path = path;
  pending->async = options.async;
  pending->generation = agreedGeneration(path);
  pending->tensors.push_back("params");
  for (const auto& s : optimizer_.state()) pending->tensors.push_back("optimizer." + s.name);
  pending->metadata = metadata;
  pending->metadata["optimizer_steps"] = std::to_string(optimizer_.steps());
  if (world_.rank == 0) stageBuffers(*pending);
  if (placement_.keepsShard()) writeShard(*pending, options);
  if (!pending->copied->recorded()) recordCopied(*pending);  // where no asynchronous write recorded it
  pending->stagedSeconds = secondsSince(pending->start);
  pending_ = std::move(pending);
  if (!options.async) settle({.wait = true});
}

runtime::Allocator& ShardedCheckpointer::hostAllocator() const {
  return pinned_ ? *pinned_ : runtime::cpuAllocator();
}

void ShardedCheckpointer::recordCopied(Pending& pending) const {
  if (const runtime::Stream* stream = placement_.memory().stream()) pending.copied->record(*stream);
}

// Rank 0: the buffers, copied in stream order into host memory kept from save to save (one
// checkpoint is in flight at most); the commit waits for `copied`.
void ShardedCheckpointer::stageBuffers(Pending& pending) {
  for (size_t i = 0; i < params_.bufferEntries().size(); ++i) {
    const runtime::Tensor& buffer = params_.buffer(i);
    if (bufferStaging_.size() <= i) bufferStaging_.push_back(runtime::Tensor::zeros(buffer.shape(), hostAllocator()));
    placement_.memory().copyToHost(bufferStaging_[i].data(), buffer.data(), static_cast<size_t>(buffer.numel()));
    pending.buffers.push_back({params_.bufferEntries()[i].name, bufferStaging_[i]});
  }
}

// The parameters into staging[0] (this rank's pieces of the whole buffer, or the packed shard at
// stage 3), each optimizer state tensor (a packed shard already) into the next; on a GPU enqueued
// on the compute stream, ahead of whatever training enqueues next.
void ShardedCheckpointer::stageShards(const std::vector<float*>& staging) const {
  placement_.stageParams(staging[0]);
  const std::vector<nn::Optimizer::StateTensor> state = optimizer_.state();
  for (size_t i = 0; i < state.size(); ++i) {
    placement_.memory().copyToHost(staging[i + 1], state[i].tensor.data(), placement_.shardMap().shardNumel());
  }
}

// Synchronously: the parameters packed into packed_ (the stream waited for), and the optimizer's
// state tensors as they are (a GPU's copied to the host by writeCheckpoint, after that wait).
// Asynchronously: the copies only started (stageShards), the writer waiting for them (`copied`).
void ShardedCheckpointer::writeShard(Pending& pending, const SaveOptions& options) {
  const nn::ShardMap& map = placement_.shardMap();
  try {
    if (!options.async) {
      if (!packed_.defined()) packed_ = runtime::Tensor::zeros({static_cast<int64_t>(map.shardNumel())});
      placement_.packParams(packed_.data());
      nn::ShardWrite write{.path = pending.path, .generation = pending.generation, .shards = {{"params", packed_}}};
      for (const auto& s : optimizer_.state()) write.shards.push_back({"optimizer." + s.name, s.tensor});
      pending.file = nn::writeShardFile(map, write);
      return;
    }
    if (!writer_) {
      writer_ = std::make_unique<nn::AsyncShardWriter>(
          map, nn::AsyncShardWriterOptions{.timeout = timeout_, .stagingAllocator = pinned_.get()});
    }
    std::function<void()> ready;
    if (placement_.memory().onGpu()) {
      ready = [copied = pending.copied, timeout = timeout_] { copied->synchronize(timeout); };
    }
    writer_->submitStaged({.path = pending.path,
                           .generation = pending.generation,
                           .names = pending.tensors,
                           .stage =
                               [&](const std::vector<float*>& staging) {
                                 stageShards(staging);
                                 recordCopied(pending);
                               },
                           .ready = std::move(ready)});
  } catch (...) {
    pending.error = std::current_exception();
  }
}

std::optional<CheckpointCommit> ShardedCheckpointer::settle(const SettleOptions& options) {
  if (!pending_) return std::nullopt;
  if (!options.wait) {
    double busy = writer_ && writer_->busy() ? 1 : 0;
    collectives_.reduce({&busy, 1}, ScalarOp::kMax);
    if (busy != 0) return std::nullopt;
  }
  // Settled from here, committed or not: a failed checkpoint is dropped (the previous one stays).
  const std::unique_ptr<Pending> pending = std::move(pending_);
  std::optional<nn::ShardFile> file = pending->file;
  std::exception_ptr mine = pending->error;
  if (pending->async && placement_.keepsShard() && !mine) {
    try {
      file = writer_->wait();
    } catch (...) {
      mine = std::current_exception();
    }
  }
  const nn::CommitReport report = commit(*pending, gatherFiles(*pending, file, mine));
  auto step = pending->metadata.find("step");
  return CheckpointCommit{.path = pending->path,
                          .generation = pending->generation,
                          .shardFiles = placement_.shardMap().worldSize(),
                          .step = step == pending->metadata.end() ? std::string() : step->second,
                          .stagedSeconds = pending->stagedSeconds,
                          .writtenSeconds = secondsSince(pending->start),
                          .stagingBytes = pending->async && writer_ ? writer_->stagingBytes() : 0,
                          .cleanupErrors = report.cleanupErrors};
}

// The barrier: every rank has its file durable (or has failed) before any manifest is written. The
// sizes and CRCs travel as raw bits (JobCollectives::reduce), each in its shard rank's slots.
std::vector<nn::ShardFile> ShardedCheckpointer::gatherFiles(const Pending& pending,
                                                            const std::optional<nn::ShardFile>& file,
                                                            std::exception_ptr mine) {
  const nn::ShardMap& map = placement_.shardMap();
  if (!mine && placement_.keepsShard() && !file) {
    mine = std::make_exception_ptr(IoError(pending.path + ": this rank's shard file was never written"));
  }
  agreeOnFailure(mine, pending.path + ": the shard files of generation " + std::to_string(pending.generation));
  const auto shards = static_cast<size_t>(map.worldSize());
  std::vector<double> slots(2 * shards, 0.0);
  if (placement_.keepsShard()) {
    slots[2 * static_cast<size_t>(map.rank())] = static_cast<double>(file->bytes);
    slots[2 * static_cast<size_t>(map.rank()) + 1] = static_cast<double>(file->crc32c);
  }
  collectives_.reduce(slots, ScalarOp::kSum);
  std::vector<nn::ShardFile> files;
  for (size_t r = 0; r < shards; ++r) {
    files.push_back({.path = nn::shardFilePath(pending.path, pending.generation, static_cast<int>(r), map.worldSize()),
                     .bytes = static_cast<uint64_t>(slots[2 * r]),
                     .crc32c = static_cast<uint32_t>(slots[2 * r + 1])});
  }
  return files;
}

nn::CommitReport ShardedCheckpointer::commit(const Pending& pending, const std::vector<nn::ShardFile>& files) {
  nn::CommitReport report;
  std::exception_ptr problem;
  if (world_.rank == 0) {
    try {
      pending.copied->synchronize(timeout_);  // the buffers' copies (a GPU's)
      report = nn::commitShardedCheckpoint(placement_.shardMap(), {.path = pending.path,
                                                                   .generation = pending.generation,
                                                                   .tensors = pending.tensors,
                                                                   .metadata = pending.metadata,
                                                                   .files = files,
                                                                   .rereadFiles = false,
                                                                   .whole = pending.buffers});
    } catch (...) {
      problem = std::current_exception();
    }
  }
  agreeOnFailure(problem, pending.path + ": committing generation " + std::to_string(pending.generation));
  return report;
}

void ShardedCheckpointer::load(const std::string& path, const nn::ShardedManifest& manifest) {
  settle({.wait = true});
  std::vector<nn::NamedTensor> shards;
  std::exception_ptr problem;
  try {
    shards = nn::readReshardedShards(path, placement_.shardMap());
    if (!findNamed(shards, "params")) COHORT_THROW(IoError) << path << ": the shard files hold no 'params'";
    for (const auto& s : optimizer_.state()) {
      if (!findNamed(shards, "optimizer." + s.name)) {
        COHORT_THROW(IoError) << path << ": the shard files hold no 'optimizer." << s.name << "'";
      }
    }
    for (const nn::ParamBuffer::Entry& e : params_.bufferEntries()) {
      const nn::NamedTensor* t = findNamed(manifest.whole, e.name);
      if (!t || t->tensor.numel() != e.shape.numel()) {
        COHORT_THROW(IoError) << path << ": the manifest holds no buffer '" << e.name << "' of shape " << e.shape.str();
      }
    }
    metadataCount(manifest.metadata, "optimizer_steps", path);
  } catch (...) {
    problem = std::current_exception();
  }
  agreeOnFailure(problem, path + ": reading the shard files");  // nothing changed yet on any rank
  placement_.memory().synchronize(timeout_);  // a GPU's: the blocking copies below do not wait for its stream
  placement_.unpackParams(findNamed(shards, "params")->tensor.data());
  for (const auto& s : optimizer_.state()) s.tensor.copyFrom(findNamed(shards, "optimizer." + s.name)->tensor);
  optimizer_.setSteps(metadataCount(manifest.metadata, "optimizer_steps", path));
  for (size_t i = 0; i < params_.bufferEntries().size(); ++i) {
    params_.buffer(i).copyFrom(findNamed(manifest.whole, params_.bufferEntries()[i].name)->tensor);
  }
  placement_.gatherParams();
}

}  // namespace cohort::train
