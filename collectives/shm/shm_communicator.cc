// ShmCommunicator: the Communicator interface over ShmEngine, with a progress thread per
// communicator that runs the collectives in issue order (see shm_engine.h and docs/collectives.md).
// A caller blocked in Work::wait() runs the queued collectives up to its own inline when the
// progress thread is idle (same order, one engine user at a time), which saves two thread hand-offs
// per small collective. Works are pooled (work_pool.h): one may be destroyed after its
// communicator, but not waited for (a COHORT_CHECK).
#include "collectives/shm/shm_communicator.h"

#include <pthread.h>
#include <sched.h>

#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "collectives/placement.h"
#include "collectives/shm/shm_engine.h"
#include "collectives/split.h"
#include "collectives/work_pool.h"
#include "runtime/error.h"

namespace cohort::collectives {

namespace {

class ShmWork;

// Implemented by ShmCommunicator: lets a waiting caller run queued collectives itself.
class WorkRunner {
 public:
  virtual ~WorkRunner() = default;
  virtual void waitFor(ShmWork& work, std::chrono::milliseconds timeout) = 0;
};

// One collective: its arguments, for the thread that runs it, and its completion (QueuedWork).
// Pooled by the communicator; its WorkQueue owns it too until it has run.
class ShmWork : public QueuedWork {
 public:
  explicit ShmWork(WorkRunner& runner) : QueuedWork("shm"), runner_(runner) {}

  void start(const shm::CollectiveArgs& args) {
    args_ = args;
    restart();
  }
  const shm::CollectiveArgs& args() const { return args_; }
  const Fingerprint& fingerprint() const override { return args_.fingerprint; }

 private:
  void waitUntilFinished(std::chrono::milliseconds timeout) override { runner_.waitFor(*this, timeout); }

  WorkRunner& runner_;
  shm::CollectiveArgs args_;
};

// How long Work::wait, past its own deadline, lets a running collective report the engine's more
// specific error (see waitFor).
constexpr std::chrono::seconds kEngineReportGrace{2};

// Tuning knobs for benchmarks (docs/collectives.md); every rank of a job must see the same values.
size_t bytesFromEnvironment(const char* name, size_t fallback, unsigned long long lo, unsigned long long hi) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  unsigned long long value = std::strtoull(text, &end, 10);
  if (*end != '\0' || value < lo || value > hi) {
    COHORT_THROW(InvalidArgument) << name << "='" << text << "': expected bytes in [" << lo << ", " << hi << "]";
  }
  return static_cast<size_t>(value);
}

class ShmCommunicator : public Communicator, public WorkRunner {
 public:
  // scope: "" for the job's communicator; a group's (split) prefixes its segment names.
  ShmCommunicator(const CommunicatorOptions& options, const std::string& scope)
      : options_(options),
        scope_(scope),
        engine_(
            {.world = options.world,
             .timeout = options.timeout,
             .chunkBytes = bytesFromEnvironment("COHORT_SHM_CHUNK_BYTES", shm::kDefaultChunkBytes, 4096, 1ull << 30),
             .streamingBytes = bytesFromEnvironment("COHORT_SHM_STREAMING_BYTES", shm::kStreamingBytes, 0, ~0ull),
             .scope = scope}),
        buffers_(std::make_shared<shm::BufferRegistry>(options.world.jobId, scope, options.world.localRank,
                                                       static_cast<uint64_t>(options.world.restartCount))),
        thread_([this] { progressLoop(); }) {}

  ~ShmCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  int rank() const override { return engine_.rank(); }
  int size() const override { return engine_.size(); }
  std::string backend() const override { return "shm"; }

  WorkPtr allReduce(const void* input, void* output, size_t count, const AllReduceOptions& options) override {
    return enqueue(allReduceCall(input, output, count, options), input, output);
  }

  WorkPtr reduceScatter(const void* input, void* output, size_t countPerRank,
                        const ReduceScatterOptions& options) override {
    return enqueue(reduceScatterCall(input, output, countPerRank, options, rank(), size()), input, output);
  }

  WorkPtr allGather(const void* input, void* output, size_t countPerRank, const AllGatherOptions& options) override {
    return enqueue(allGatherCall(input, output, countPerRank, options, rank(), size()), input, output);
  }

  WorkPtr broadcast(void* data, size_t count, const BroadcastOptions& options) override {
    return enqueue(broadcastCall(data, count, options, size()), data, data);
  }

  WorkPtr barrier() override { return enqueue({.kind = CollectiveKind::kBarrier}, nullptr, nullptr); }

  // Collective: one segment per rank, which every peer maps before the names go (shm_buffers.h).
  BufferPtr allocateBuffer(size_t count) override {
    if (size() == 1) return Communicator::allocateBuffer(count);
    return buffers_->allocate(count, [&](uint64_t id, size_t bytes) { shareBuffer(id, bytes); });
  }

  // A group is a communicator of its own over a segment of its own, named in the job's private
  // directory like every segment (ipc/shm_names.h) after this one's scope, the split's number and
  // the color, so groups never share a name; its rank 0 creates it, the others open it.
  std::unique_ptr<Communicator> split(const SplitOptions& options) override {
    const SplitPlan plan = planSplit(*this, options, options_.timeout);
    const uint64_t index = splits_++;
    if (plan.rank < 0) return nullptr;
    CommunicatorOptions group = options_;
    group.world.rank = group.world.localRank = plan.rank;
    group.world.worldSize = group.world.localWorldSize = plan.size();
    return std::make_unique<ShmCommunicator>(group, scope_ + groupScope(index, plan.color));
  }

 private:
  // Every rank's (count, id) of this allocation, exactly in floats (count < 2^48, id < 2^24); the
  // gather is also the barrier after which every segment exists. Then each rank maps its peers'.
  void shareBuffer(uint64_t id, size_t bytes) {
    const size_t count = bytes / sizeof(float);
    if (count >= (uint64_t{1} << 48) || id >= (uint64_t{1} << 24)) {
      COHORT_THROW(InvalidArgument) << "allocateBuffer: buffer " << id << " of " << count << " floats is beyond what "
                                    << "the shm backend can name";
    }
    constexpr uint64_t kLow = (uint64_t{1} << 24) - 1;
    const float mine[3] = {static_cast<float>(count >> 24), static_cast<float>(count & kLow), static_cast<float>(id)};
    std::vector<float> all(3 * static_cast<size_t>(size()));
    allGather(mine, all.data(), 3, {})->wait(options_.timeout);
    auto countOf = [&](int q) {
      return static_cast<uint64_t>(all[3 * q]) << 24 | static_cast<uint64_t>(all[3 * q + 1]);
    };
    for (int q = 0; q < size(); ++q) {
      if (countOf(q) != countOf(0)) {
        COHORT_THROW(InvalidArgument) << "allocateBuffer is collective, but rank 0 asked for " << countOf(0)
                                      << " floats and rank " << q << " for " << countOf(q);
      }
    }
    for (int q = 0; q < size(); ++q) {
      if (q != rank()) engine_.mapPeerBuffer(q, static_cast<uint64_t>(all[3 * q + 2]), bytes);
    }
    barrier()->wait(options_.timeout);  // every rank has mapped every buffer: the owners may remove the names
  }

  // Where the buffers lie when a direct path may use them (shm_engine.h): looked up at issue.
  WorkPtr enqueue(Fingerprint fp, const void* input, void* output) {
    shm::CollectiveArgs args;
    args.input = input;
    args.output = output;
    const shm::ShmEngine::DirectBytes direct = engine_.directBytes(fp);
    if (direct.input > 0) {
      args.inputRef = buffers_->find(input, direct.input);
      args.outputRef = buffers_->find(output, direct.output);
    }
    fp.sequence = nextSequence_++;
    args.fingerprint = fp;
    PooledPtr<ShmWork> work = pool_.acquire(*this);
    work->start(args);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push(*work);
    }
    wake_.notify_all();
    return work;
  }

  // The progress thread: runs queued collectives in issue order while nobody waits for them.
  void progressLoop() {
    yieldToCallerOnSharedCpu();
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return !busy_ && (stopping_ || !queue_.empty()); });
      if (queue_.empty() && !busy_) return;  // stopping, and everything issued has run
      if (!queue_.empty() && !busy_) runFront(lock);
    }
  }

  // A worker pinned to one CPU (cohortrun --bind, mpirun's binding) cannot overlap anything with
  // its progress thread, and when the thread woke on every issue it often preempted the issuing
  // thread and ran the collective itself: two context switches, a 4 KiB all-reduce at 3.9 us instead
  // of 1.7 us. At SCHED_IDLE it runs only while the worker's thread sleeps, so the caller's wait()
  // runs the collectives inline, and nothing issued is left unprogressed while the caller blocks.
  static void yieldToCallerOnSharedCpu() {
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    if (sched_getaffinity(0, sizeof cpus, &cpus) != 0 || CPU_COUNT(&cpus) != 1) return;
    sched_param param{};
    pthread_setschedparam(pthread_self(), SCHED_IDLE, &param);
  }

  // A caller waiting for `work` runs the queued collectives up to it itself when the progress
  // thread is not busy: the same issue order, without two thread hand-offs (small-message latency).
  void waitFor(ShmWork& work, std::chrono::milliseconds timeout) override {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    bool graceUsed = false;
    std::unique_lock<std::mutex> lock(mutex_);
    while (!work.finished()) {
      if (!busy_ && !queue_.empty()) {
        runFront(lock);
        continue;
      }
      if (wake_.wait_until(lock, deadline) == std::cv_status::timeout && !work.finished() &&
          (busy_ || queue_.empty())) {
        // The engine is still inside a collective and enforces the communicator's own timeout, whose
        // error names the ranks that did not arrive: give it a moment to report that rather than
        // this generic one (the two timeouts are often equal and race).
        if (busy_ && !graceUsed) {
          graceUsed = true;
          deadline = std::chrono::steady_clock::now() + kEngineReportGrace;
          continue;
        }
        std::ostringstream secs;
        secs << std::fixed << std::setprecision(1) << timeout.count() / 1000.0;
        COHORT_THROW(TimeoutError) << "collective " << work.fingerprint().str() << " did not complete within "
                                   << secs.str() << " s on rank " << rank() << " (Work::wait)";
      }
    }
  }

  // Pops the front collective and runs it with mutex_ released; busy_ keeps the engine
  // single-threaded.
  void runFront(std::unique_lock<std::mutex>& lock) {
    PooledPtr<ShmWork> work = queue_.pop();
    busy_ = true;
    lock.unlock();
    std::exception_ptr error = broken_;
    if (!error) {
      try {
        engine_.run(work->args());
      } catch (...) {
        error = std::current_exception();
        broken_ = error;  // the communicator is unusable from now on (communicator.h)
      }
    }
    work->finish(std::move(error));
    work.reset();  // the queue's ownership: the object may go back to the pool now
    lock.lock();
    busy_ = false;
    wake_.notify_all();
  }

  WorkPool<ShmWork> pool_;             // destroyed last: it frees the idle Works (in-use ones free themselves)
  const CommunicatorOptions options_;  // its world: this communicator's ranks
  const std::string scope_;
  shm::ShmEngine engine_;
  std::shared_ptr<shm::BufferRegistry> buffers_;
  uint64_t nextSequence_ = 0;  // issuing thread only
  uint64_t splits_ = 0;        // issuing thread only
  std::mutex mutex_;
  std::condition_variable wake_;
  WorkQueue<ShmWork> queue_;  // guarded by mutex_
  bool stopping_ = false;
  bool busy_ = false;          // a thread is running engine_ (guarded by mutex_)
  std::exception_ptr broken_;  // written only by the thread running engine_
  std::thread thread_;         // last: started once everything above exists
};

}  // namespace

std::unique_ptr<Communicator> makeShmCommunicator(const CommunicatorOptions& options) {
  return std::make_unique<ShmCommunicator>(options, "");
}

}  // namespace cohort::collectives
