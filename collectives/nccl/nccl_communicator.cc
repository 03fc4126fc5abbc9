// The nccl backend's Communicator and Works over NcclState (nccl_state.h, where a collective's life
// is described), its device buffers, its creation and its groups (split).
#include "collectives/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <thread>

#include "collectives/nccl/nccl_init.h"
#include "collectives/nccl/nccl_state.h"
#include "collectives/placement.h"
#include "collectives/split.h"
#include "collectives/watchdog.h"
#include "collectives/work_pool.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/precision_kernels.h"
#include "runtime/error.h"
#include "runtime/stream.h"

namespace cohort::collectives {
namespace {

using Clock = std::chrono::steady_clock;
using nccl::kHostStagingFloats;
using nccl::kStagingOffset;
using nccl::Launch;
using nccl::NcclCall;
using nccl::NcclLibrary;
using nccl::ncclOp;
using nccl::NcclState;
using nccl::ncclType;
using nccl::seconds;

// Zeroed device memory from cudaMalloc, freed with the Buffer.
class DeviceBuffer : public Buffer {
 public:
  static std::unique_ptr<DeviceBuffer> allocate(size_t count, const runtime::Stream& stream,
                                                std::chrono::milliseconds timeout) {
    const int device = stream.device().index;
    runtime::cuda::CudaDeviceGuard guard(device);
    const size_t bytes = std::max<size_t>(256, count * sizeof(float));
    void* p = nullptr;
    COHORT_CUDA_CHECK(cudaMalloc(&p, bytes));
    std::unique_ptr<DeviceBuffer> buffer(new DeviceBuffer(static_cast<float*>(p), count, device));
    // Zeroed on the communication stream, so the collectives that use the buffer come after.
    COHORT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, static_cast<cudaStream_t>(stream.native())));
    stream.synchronize(timeout);
    return buffer;
  }
  ~DeviceBuffer() override {
    runtime::cuda::QuietDeviceGuard guard(device_);
    cudaFree(data());
  }

 private:
  DeviceBuffer(float* data, size_t count, int device) : Buffer(data, count), device_(device) {}
  int device_;
};

// A host-staged collective's result (see kHostStagingFloats): `count` floats from the staging area
// to `output`, copied by Work::wait once the collective is done.
struct HostCopy {
  bool staged = false;  // false: a collective on device memory, nothing to copy
  const float* staging = nullptr;
  float* output = nullptr;
  size_t count = 0;
};

// Pooled by the communicator (work_pool.h). Its `done` event is one per collective: the watchdog
// may still probe it after the Work has gone.
class NcclWork : public PooledWork {
 public:
  NcclWork(std::shared_ptr<NcclState> state, int device) : state_(std::move(state)), device_(device) {}

  // A staged collective's wait() always waits on the host, with or without a compute stream.
  void start(std::shared_ptr<runtime::Event> done, const Fingerprint& fingerprint, const HostCopy& copyOut = {}) {
    done_ = std::move(done);
    fingerprint_ = fingerprint;
    copyOut_ = copyOut;
  }

  bool done() override {
    state_->rethrowIfFailed();
    if (!done_->query()) return false;
    state_->checkAsyncError(fingerprint_);
    return true;
  }

  // The stream waits for the done event (no host wait), as wait() with a compute stream does; a
  // host-staged collective's result arrives only through the host, so that one waits there.
  void waitOn(const runtime::Stream& stream, std::chrono::milliseconds timeout) override {
    state_->rethrowIfFailed();
    if (copyOut_.staged) return wait(timeout);
    if (stream.device().index != device_) {
      COHORT_THROW(InvalidArgument) << "nccl " << fingerprint_.str()
                                    << ": Work::waitOn got a stream on cuda:" << stream.device().index << ", but rank "
                                    << state_->rank() << " runs on cuda:" << device_;
    }
    stream.waitEvent(*done_);
  }

  void wait(std::chrono::milliseconds timeout) override {
    state_->rethrowIfFailed();
    const runtime::Stream* compute = state_->computeStream();
    if (compute && !copyOut_.staged) {
      compute->waitEvent(*done_);  // the GPU orders the caller's next kernels after the collective
      return;
    }
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline = start + timeout;
    std::chrono::microseconds sleep{0};
    while (!done_->query()) {
      state_->rethrowIfFailed();
      const Clock::time_point now = Clock::now();
      if (now >= deadline) {
        COHORT_THROW(TimeoutError) << "nccl " << fingerprint_.str() << " did not complete within " << seconds(timeout)
                                   << " on rank " << state_->rank()
                                   << " (Work::wait); the watchdog aborts the communicator if it is still pending "
                                   << seconds(state_->timeout()) << " after it was issued";
      }
      // Spin for the first 100 us (small collectives end there), yield up to 2 ms, then sleep.
      if (now - start < std::chrono::microseconds(100)) continue;
      if (now - start < std::chrono::milliseconds(2)) {
        std::this_thread::yield();
        continue;
      }
      sleep = std::min(std::chrono::microseconds(1000), sleep + std::chrono::microseconds(50));
      std::this_thread::sleep_for(sleep);
    }
    state_->rethrowIfFailed();
    state_->checkAsyncError(fingerprint_);
    if (copyOut_.staged) {
      if (copyOut_.count > 0) {
        runtime::cuda::CudaDeviceGuard guard(device_);
        COHORT_CUDA_CHECK(
            cudaMemcpy(copyOut_.output, copyOut_.staging, copyOut_.count * sizeof(float), cudaMemcpyDeviceToHost));
      }
      copyOut_ = {};
    }
  }

 private:
  std::shared_ptr<NcclState> state_;
  int device_;
  std::shared_ptr<runtime::Event> done_;
  Fingerprint fingerprint_;
  HostCopy copyOut_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclState> state, int device) : state_(std::move(state)), device_(device) {}

  int rank() const override { return state_->rank(); }
  int size() const override { return state_->size(); }
  std::string backend() const override { return "nccl"; }

  WorkPtr allReduce(const void* input, void* output, size_t count, const AllReduceOptions& options) override {
    const Fingerprint fingerprint{
        .kind = CollectiveKind::kAllReduce, .op = options.op, .dtype = options.dtype, .count = count};
    const ncclRedOp_t op = ncclOp(options.op);
    if (options.dtype == runtime::DType::kF32 && isSmallHostBuffer(input, count) && isSmallHostBuffer(output, count)) {
      float* staging = state_->scratch() + kStagingOffset;
      return startStaged(fingerprint, static_cast<const float*>(input), static_cast<float*>(output), count,
                         [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
                           return nccl.allReduce(staging, staging, count, ncclFloat, op, comm, s);
                         });
    }
    checkDevicePointer(input, count, "allReduce", "input");
    checkDevicePointer(output, count, "allReduce", "output");
    if (options.dtype == runtime::DType::kBF16) return reduceWidened(fingerprint, input, output, count, count);
    return start(fingerprint, {.call = [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
                   return nccl.allReduce(input, output, count, ncclFloat, op, comm, s);
                 }});
  }

  // NCCL's in place (output == input + rank*countPerRank) is what NCCL takes as it is: no copies.
  WorkPtr reduceScatter(const void* input, void* output, size_t countPerRank,
                        const ReduceScatterOptions& options) override {
    reduceScatterPlacement(input, output, countPerRank, options.dtype, rank(), size());
    checkDevicePointer(input, countPerRank, "reduceScatter", "input");
    checkDevicePointer(output, countPerRank, "reduceScatter", "output");
    const Fingerprint fingerprint{
        .kind = CollectiveKind::kReduceScatter, .op = options.op, .dtype = options.dtype, .count = countPerRank};
    if (options.dtype == runtime::DType::kBF16) {
      return reduceWidened(fingerprint, input, output, countPerRank * static_cast<size_t>(size()), countPerRank);
    }
    const ncclRedOp_t op = ncclOp(options.op);
    return start(fingerprint, {.call = [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
                   return nccl.reduceScatter(input, output, countPerRank, ncclFloat, op, comm, s);
                 }});
  }

  // NCCL's in place (input == output + rank*countPerRank) as it is.
  WorkPtr allGather(const void* input, void* output, size_t countPerRank, const AllGatherOptions& options) override {
    allGatherPlacement(input, output, countPerRank, options.dtype, rank(), size());
    checkDevicePointer(input, countPerRank, "allGather", "input");
    checkDevicePointer(output, countPerRank, "allGather", "output");
    const Fingerprint fingerprint{.kind = CollectiveKind::kAllGather, .dtype = options.dtype, .count = countPerRank};
    const ncclDataType_t type = ncclType(options.dtype);
    return start(fingerprint, {.call = [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
                   return nccl.allGather(input, output, countPerRank, type, comm, s);
                 }});
  }

  WorkPtr broadcast(void* data, size_t count, const BroadcastOptions& options) override {
    checkRoot(options.root, size());
    const int root = options.root;
    const Fingerprint fingerprint{
        .kind = CollectiveKind::kBroadcast, .dtype = options.dtype, .root = root, .count = count};
    if (options.dtype == runtime::DType::kF32 && isSmallHostBuffer(data, count)) {
      float* staging = state_->scratch() + kStagingOffset;
      float* host = static_cast<float*>(data);
      return startStaged(fingerprint, host, host, count, [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
        return nccl.broadcast(staging, staging, count, ncclFloat, root, comm, s);
      });
    }
    checkDevicePointer(data, count, "broadcast", "data");
    const ncclDataType_t type = ncclType(options.dtype);
    return start(fingerprint, {.call = [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
                   return nccl.broadcast(data, data, count, type, root, comm, s);
                 }});
  }

  // A one-float all-reduce of a zero scratch value: every rank's stream passes it only once all have
  // issued it.
  WorkPtr barrier() override {
    float* scratch = state_->scratch();
    Fingerprint fingerprint{.kind = CollectiveKind::kBarrier};
    auto done = state_->issue(fingerprint, {.call = [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
                                return nccl.allReduce(scratch, scratch, 1, ncclFloat, ncclSum, comm, s);
                              }});
    return makeWork(std::move(done), fingerprint);
  }

  BufferPtr allocateBuffer(size_t count) override {
    state_->rethrowIfFailed();
    return DeviceBuffer::allocate(count, state_->commStream(), state_->timeout());
  }

  // Every rank's color and key are gathered on the device first (waited for with the timeout, so
  // every rank has arrived before ncclCommSplit, which has no bound of its own, and a bad color is
  // the same InvalidArgument on every rank); the group is then ncclCommSplit's, keyed by the plan's
  // rank, with this communicator's timeout and compute stream.
  std::unique_ptr<Communicator> split(const SplitOptions& options) override {
    const SplitPlan plan = gatherPlan(options);
    nccl::NcclSetup setup = state_->split(plan.rank < 0 ? NCCL_SPLIT_NOCOLOR : plan.color, plan.rank);
    if (plan.rank < 0) return nullptr;
    CommunicatorOptions group{
        .backend = "nccl", .timeout = state_->timeout(), .computeStream = state_->computeStream()};
    group.world.rank = group.world.localRank = plan.rank;
    group.world.worldSize = group.world.localWorldSize = plan.size();
    try {
      return std::make_unique<NcclCommunicator>(std::make_shared<NcclState>(group, setup), device_);
    } catch (...) {
      setup.nccl->commAbort(setup.comm);  // the state never took it over
      throw;
    }
  }

 private:
  // planSplit's all-gather, through device memory: the bits of every rank's (color, key).
  SplitPlan gatherPlan(const SplitOptions& options) {
    const auto n = static_cast<size_t>(size());
    BufferPtr table = allocateBuffer(2 * n);
    float* mine = table->data() + 2 * static_cast<size_t>(rank());
    const int32_t pair[2] = {options.color, options.key};
    std::vector<int32_t> all(2 * n);
    {
      runtime::cuda::CudaDeviceGuard guard(device_);
      COHORT_CUDA_CHECK(cudaMemcpy(mine, pair, sizeof pair, cudaMemcpyHostToDevice));
      WorkPtr work = allGather(mine, table->data(), 2, {});
      state_->commStream().synchronize(state_->timeout());  // the host's own wait, whatever the compute stream
      work->wait(state_->timeout());
      COHORT_CUDA_CHECK(cudaMemcpy(all.data(), table->data(), 2 * n * sizeof(int32_t), cudaMemcpyDeviceToHost));
    }
    std::vector<int> colors(n), keys(n);
    for (size_t r = 0; r < n; ++r) {
      colors[r] = all[2 * r];
      keys[r] = all[2 * r + 1];
    }
    return planFrom(std::move(colors), std::move(keys), rank());
  }

  // A bf16 all-reduce or reduce-scatter: widened into the fp32 scratch on the communication
  // stream, reduced in fp32 by NCCL, and rounded to bf16 once (docs/collectives.md), so the bits do
  // not depend on NCCL's algorithm and match the CPU backends'. inCount / outCount: elements.
  WorkPtr reduceWidened(const Fingerprint& fingerprint, const void* input, void* output, size_t inCount,
                        size_t outCount) {
    float* wide = state_->wideScratch(inCount + outCount);
    float* wideOut = wide + inCount;
    const runtime::Stream& stream = state_->commStream();
    const ncclRedOp_t op = ncclOp(fingerprint.op);
    const bool scatter = fingerprint.kind == CollectiveKind::kReduceScatter;
    return start(
        fingerprint,
        {.before = [=, &stream](cudaStream_t) { runtime::cuda::convertToFloat(input, wide, inCount, stream); },
         .call =
             [=](const NcclLibrary& nccl, ncclComm_t comm, cudaStream_t s) {
               return scatter ? nccl.reduceScatter(wide, wideOut, outCount, ncclFloat, op, comm, s)
                              : nccl.allReduce(wide, wideOut, outCount, ncclFloat, op, comm, s);
             },
         .after = [=, &stream](cudaStream_t) { runtime::cuda::convertToBf16(wideOut, output, outCount, stream); }});
  }

  // Count 0 enqueues no NCCL call (every rank has the same count); the events still order it.
  WorkPtr start(Fingerprint fingerprint, Launch launch) {
    if (fingerprint.count == 0) launch = {};
    auto done = state_->issue(fingerprint, launch);
    return makeWork(std::move(done), fingerprint);
  }

  WorkPtr makeWork(std::shared_ptr<runtime::Event> done, const Fingerprint& fingerprint, const HostCopy& copyOut = {}) {
    PooledPtr<NcclWork> work = pool_.acquire(state_, device_);
    work->start(std::move(done), fingerprint, copyOut);
    return work;
  }

  // A host-staged collective (see kHostStagingFloats): the input goes to the staging area at issue,
  // the result comes back in Work::wait.
  WorkPtr startStaged(Fingerprint fingerprint, const float* input, float* output, size_t count, NcclCall call) {
    float* staging = state_->scratch() + kStagingOffset;
    const size_t bytes = count * sizeof(float);
    Launch launch{.before =
                      [=](cudaStream_t s) {
                        COHORT_CUDA_CHECK(cudaMemcpyAsync(staging, input, bytes, cudaMemcpyHostToDevice, s));
                      },
                  .call = std::move(call)};
    if (fingerprint.count == 0) launch = {};
    auto done = state_->issue(fingerprint, launch);
    return makeWork(std::move(done), fingerprint,
                    {.staged = true, .staging = staging, .output = output, .count = count});
  }

  // Host memory of at most kHostStagingFloats elements (pointers CUDA does not know, or pinned
  // host memory) goes through the staging area.
  static bool isSmallHostBuffer(const void* p, size_t count) {
    if (p == nullptr || count > kHostStagingFloats) return false;
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
      cudaGetLastError();
      return true;
    }
    return attributes.type == cudaMemoryTypeUnregistered || attributes.type == cudaMemoryTypeHost;
  }

  // Larger host memory handed to NCCL would fault on the GPU (or hang the peers): refuse it at issue.
  void checkDevicePointer(const void* p, size_t count, const char* collective, const char* which) const {
    if (count == 0) return;
    if (p == nullptr) {
      COHORT_THROW(InvalidArgument) << "nccl " << collective << ": the " << which << " is null for " << count
                                    << " elements";
    }
    cudaPointerAttributes attributes{};
    const cudaError_t status = cudaPointerGetAttributes(&attributes, p);
    if (status != cudaSuccess) cudaGetLastError();
    const bool onDevice =
        status == cudaSuccess && (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged);
    if (onDevice && attributes.device == device_) return;
    std::ostringstream os;
    os << "nccl " << collective << ": the " << which << " (" << p << ") is ";
    if (onDevice)
      os << "memory of cuda:" << attributes.device;
    else
      os << "host memory (beyond the " << kHostStagingFloats << " elements staged through the device)";
    os << ", but rank " << rank() << "'s nccl backend takes device memory on cuda:" << device_
       << " (Communicator::allocateBuffer gives some)";
    throw InvalidArgument(os.str());
  }

  std::shared_ptr<NcclState> state_;
  int device_;
  WorkPool<NcclWork> pool_;  // its idle Works hold state_ too; Works in use free themselves
};

}  // namespace

std::unique_ptr<Communicator> makeNcclCommunicator(const CommunicatorOptions& options) {
  nccl::NcclSetup setup = nccl::initNccl(options);
  std::shared_ptr<NcclState> state;
  try {
    state = std::make_shared<NcclState>(options, setup);
  } catch (...) {
    setup.nccl->commAbort(setup.comm);  // the state never took it over
    throw;
  }
  return std::make_unique<NcclCommunicator>(std::move(state), setup.device);
}

}  // namespace cohort::collectives
