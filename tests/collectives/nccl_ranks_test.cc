// The nccl backend on 1 to 4 ranks (tags = ["gpu"]; on the emulated devices in CI: COHORT_CUDASIM_DEVICES
// is 4 for this test, and its NCCL runs the ranks through a shared segment, cudasim/nccl.cc). Each
// rank is a forked process on cuda:<rank> (the parent never touches CUDA: a process that forks
// after initialising CUDA leaves its children unable to use it). Checked exactly, every rank's own
// result (failures printed, the exit code counts them):
//   - bf16 all-reduce, reduce-scatter, all-gather, out of place and in NCCL's in-place layout;
//   - Work::waitOn(stream): a copy enqueued on a compute stream after waitOn sees the collective's
//     result (the emulated streams run their work after random delays, so a missing wait shows);
//   - split(): the node's ranks and the same local rank across nodes (one node: every rank, and
//     each rank alone), groups ordered by key, kNoGroup, and the parent still right after them.
// Data are small integers, exact in fp32 and bf16 whatever the order of the reduction.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/split.h"
#include "runtime/cuda/gpu_context.h"
#include "runtime/device_query.h"
#include "runtime/dtype.h"
#include "runtime/stream.h"
#include "tests/ipc/multiproc.h"

namespace cohort::collectives {
namespace {

using namespace std::chrono_literals;
using runtime::DType;

constexpr auto kTimeout = 60s;
constexpr int kTooFewDevices = 77;  // a rank's exit code: fewer CUDA devices than ranks (the parent skips)

float element(int rank, size_t i) {
  return static_cast<float>((5 * i + 3 * static_cast<size_t>(rank)) % 11 + 1 + rank);
}

class Rank {
 public:
  explicit Rank(const runtime::WorldInfo& world)
      : world_(world),
        copies_(runtime::Device::cuda(world.localRank), runtime::StreamOptions{.name = "test copies"}),
        comm_(makeCommunicator({.backend = "nccl", .world = world, .timeout = kTimeout})) {}

  int run() {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (bool inPlace : {false, true}) {
        for (size_t count : {size_t{1}, size_t{7}, size_t{100003}}) {
          allReduce(*comm_, allRanks(), dtype, count);
          reduceScatter(dtype, count, inPlace);
          allGather(dtype, count, inPlace);
        }
      }
    }
    waitOn();
    splits();
    allReduce(*comm_, allRanks(), DType::kF32, 1000);  // the parent after its groups
    return failures_;
  }

 private:
  std::vector<int> allRanks() const {
    std::vector<int> all;
    for (int r = 0; r < world_.worldSize; ++r) all.push_back(r);
    return all;
  }

  void fail(const std::string& what) {
    std::printf("rank %d: %s\n", world_.rank, what.c_str());
    ++failures_;
  }

  // `values` as `dtype` into `device` (count elements), and back as floats.
  void upload(void* device, const std::vector<float>& values, DType dtype) {
    std::vector<uint16_t> narrow(values.size());
    for (size_t i = 0; i < values.size(); ++i) narrow[i] = runtime::toBf16(values[i]).bits;
    const void* host = dtype == DType::kF32 ? static_cast<const void*>(values.data()) : narrow.data();
    runtime::cuda::copyToDevice(device, host, values.size() * runtime::sizeOf(dtype), copies_);
    copies_.synchronize(kTimeout);
  }
  std::vector<float> download(const void* device, size_t count, DType dtype, const runtime::Stream& stream) {
    std::vector<float> wide(count);
    std::vector<uint16_t> narrow(count);
    void* host = dtype == DType::kF32 ? static_cast<void*>(wide.data()) : narrow.data();
    runtime::cuda::copyToHost(host, device, count * runtime::sizeOf(dtype), stream);
    stream.synchronize(kTimeout);
    if (dtype == DType::kBF16) {
      for (size_t i = 0; i < count; ++i) wide[i] = runtime::toFloat(runtime::Bf16{narrow[i]});
    }
    return wide;
  }

  std::vector<float> mine(size_t count, int rank) const {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = element(rank, i);
    return v;
  }

  void expect(const std::string& what, const std::vector<float>& got, size_t from, size_t count,
              const std::function<float(size_t)>& want) {
    for (size_t i = 0; i < count; ++i) {
      if (got[from + i] != want(i)) {
        return fail(what + ": element " + std::to_string(i) + " = " + std::to_string(got[from + i]) + ", expected " +
                    std::to_string(want(i)));
      }
    }
  }

  std::string name(const char* op, DType dtype, size_t count, bool inPlace) const {
    return std::string(op) + "(" + runtime::dtypeName(dtype) + ") of " + std::to_string(count) +
           (inPlace ? " in place" : "");
  }

  // An in-place sum over `comm`, whose ranks are the parent ranks `members`.
  void allReduce(Communicator& comm, const std::vector<int>& members, DType dtype, size_t count) {
    BufferPtr data = comm.allocateBuffer(count);
    upload(data->data(), mine(count, world_.rank), dtype);
    comm.allReduce(data->data(), data->data(), count, {.dtype = dtype})->wait(kTimeout);
    expect(name("allreduce", dtype, count, true) + " over " + std::to_string(members.size()),
           download(data->data(), count, dtype, copies_), 0, count, [&](size_t i) {
             float sum = 0;
             for (int r : members) sum += element(r, i);
             return sum;
           });
  }

  // Rank r's input is mine(n * count) of rank r; in place, its output is its own chunk of it.
  void reduceScatter(DType dtype, size_t count, bool inPlace) {
    const size_t n = static_cast<size_t>(world_.worldSize), at = static_cast<size_t>(world_.rank) * count;
    const size_t bytes = runtime::sizeOf(dtype);
    BufferPtr in = comm_->allocateBuffer(n * count), out = comm_->allocateBuffer(count);
    upload(in->data(), mine(n * count, world_.rank), dtype);
    void* output = inPlace ? static_cast<void*>(reinterpret_cast<char*>(in->data()) + at * bytes) : out->data();
    comm_->reduceScatter(in->data(), output, count, {.dtype = dtype})->wait(kTimeout);
    expect(name("reducescatter", dtype, count, inPlace), download(output, count, dtype, copies_), 0, count,
           [&](size_t i) {
             float sum = 0;
             for (int r = 0; r < world_.worldSize; ++r) sum += element(r, at + i);
             return sum;
           });
  }

  // In place, rank r's input is its chunk of the output.
  void allGather(DType dtype, size_t count, bool inPlace) {
    const size_t n = static_cast<size_t>(world_.worldSize), at = static_cast<size_t>(world_.rank) * count;
    const size_t bytes = runtime::sizeOf(dtype);
    BufferPtr in = comm_->allocateBuffer(count), out = comm_->allocateBuffer(n * count);
    void* input = inPlace ? static_cast<void*>(reinterpret_cast<char*>(out->data()) + at * bytes) : in->data();
    upload(input, mine(count, world_.rank), dtype);
    comm_->allGather(input, out->data(), count, {.dtype = dtype})->wait(kTimeout);
    expect(name("allgather", dtype, count, inPlace), download(out->data(), n * count, dtype, copies_), 0, n * count,
           [&](size_t i) { return element(static_cast<int>(i / count), i % count); });
  }

  // The copy is enqueued on `compute` right after waitOn returns, without the host waiting.
  void waitOn() {
    runtime::Stream compute(runtime::Device::cuda(world_.localRank), runtime::StreamOptions{.name = "compute"});
    constexpr size_t kCount = 1 << 18;
    BufferPtr data = comm_->allocateBuffer(kCount);
    upload(data->data(), mine(kCount, world_.rank), DType::kF32);
    WorkPtr work = comm_->allReduce(data->data(), data->data(), kCount, {});
    work->waitOn(compute, kTimeout);
    expect("allreduce then waitOn(compute stream)", download(data->data(), kCount, DType::kF32, compute), 0, kCount,
           [&](size_t i) {
             float sum = 0;
             for (int r = 0; r < world_.worldSize; ++r) sum += element(r, i);
             return sum;
           });
  }

  void splits() {
    const int n = world_.worldSize, r = world_.rank;
    auto node = splitNodeRanks(*comm_, world_);
    if (node->size() != n || node->rank() != r)
      fail("node group: rank " + std::to_string(node->rank()) + " of " + std::to_string(node->size()));
    allReduce(*node, allRanks(), DType::kBF16, 1000);
    auto alone = splitSameLocalRank(*comm_, world_);
    if (alone->size() != 1 || alone->rank() != 0) fail("same-local-rank group: size " + std::to_string(alone->size()));
    allReduce(*alone, {r}, DType::kF32, 1000);
    auto reversed = comm_->split({.color = 3, .key = n - r});
    if (reversed->rank() != n - 1 - r) fail("reversed keys: rank " + std::to_string(reversed->rank()));
    auto evens = comm_->split({.color = r % 2 == 0 ? 0 : SplitOptions::kNoGroup});
    if ((r % 2 == 0) != (evens != nullptr)) fail("kNoGroup: a group where there should be none, or none where one");
    if (evens) {
      std::vector<int> members;
      for (int q = 0; q < n; q += 2) members.push_back(q);
      allReduce(*evens, members, DType::kF32, 100003);
    }
  }

  runtime::WorldInfo world_;
  runtime::Stream copies_;
  std::unique_ptr<Communicator> comm_;
  int failures_ = 0;
};

class NcclRanks : public ::testing::TestWithParam<int> {};

TEST_P(NcclRanks, OptionsAndGroupsAreExact) {
  const int n = GetParam();
  ipc::testing::ScopedShmDir shm;
  const std::string jobId = ipc::testing::freshJobId();
  std::vector<pid_t> children;
  for (int r = 0; r < n; ++r) {
    const runtime::WorldInfo world{
        .rank = r, .worldSize = n, .localRank = r, .localWorldSize = n, .jobId = jobId, .source = "test"};
    children.push_back(ipc::testing::forkChild([=] {
      if (static_cast<int>(runtime::cudaDevices().size()) < n) return kTooFewDevices;
      return Rank(world).run();
    }));
  }
  std::vector<int> codes;
  for (pid_t child : children) codes.push_back(ipc::testing::waitChild(child, std::chrono::seconds(240)));
  if (codes[0] == kTooFewDevices) GTEST_SKIP() << "needs " << n << " CUDA devices";
  for (int r = 0; r < n; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r << " (its failures above)";
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, NcclRanks, ::testing::Values(1, 2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace cohort::collectives
