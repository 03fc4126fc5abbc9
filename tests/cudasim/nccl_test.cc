// cudasim's NCCL (cudasim/nccl.cc), with ranks as forked processes as the nccl backend runs them:
//   - all-reduce (sum, avg, max, min, prod; floats, doubles, ints), reduce-scatter, all-gather and
//     broadcast give NCCL's results, in place and out of place, across the segment's slot boundary,
//     with the same bits on every rank (each rank checks its values, the parent compares digests);
//   - many collectives issued back to back run matched in issue order;
//   - non-blocking init passes through ncclInProgress until every rank has joined;
//   - the failures the backend's watchdog relies on: a peer that exits or aborts fails the others'
//     collective with ncclRemoteError within a bounded time, and ncclCommAbort from another thread
//     returns at once and lets a stream stuck in a collective drain;
//   - two ranks on one GPU, and bad arguments, are refused; no segment is left behind.
// Data are small integers, so sums are exact in any order; ncclAvg over 3 ranks is checked against
// NCCL's premultiplied sum, and against the mean.
#include "nccl.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Three ranks need three GPUs (NCCL refuses two ranks on one); set before the runtime reads it.
[[maybe_unused]] const bool kDevicesSet = setenv("COHORT_CUDASIM_DEVICES", "4", 1) == 0;

constexpr int kMaxRanks = 4;
constexpr int kMaxCases = 64;
constexpr size_t kAcrossSlots = 300001;  // floats: more than one 1 MiB slot
constexpr auto kRunDeadline = 60s;       // for all ranks of one run to exit
constexpr auto kFailureBound = 5s;       // for a failure to show in ncclCommGetAsyncError

// What the forked ranks tell the parent: flags for handshakes, and a digest of each case's output.
struct Board {
  std::atomic<int> flag[kMaxRanks];
  uint64_t digest[kMaxRanks][kMaxCases];
};

// A Board in anonymous shared memory, mapped before the fork.
class SharedBoard {
 public:
  SharedBoard() {
    void* p = mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    board_ = new (p) Board{};
  }
  ~SharedBoard() { munmap(board_, sizeof(Board)); }
  SharedBoard(const SharedBoard&) = delete;
  SharedBoard& operator=(const SharedBoard&) = delete;
  Board* operator->() const { return board_; }

 private:
  Board* board_;
};

// A fresh COHORT_SHM_DIR for one test, which must be empty again at the end: no segment is left.
class ShmDir {
 public:
  ShmDir() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/nccl-shm-XXXXXX";
    EXPECT_NE(mkdtemp(pattern.data()), nullptr);
    path_ = pattern;
    setenv("COHORT_SHM_DIR", path_.c_str(), 1);
  }
  ~ShmDir() {
    EXPECT_TRUE(std::filesystem::is_empty(path_)) << "a segment was left in " << path_;
    std::filesystem::remove_all(path_);
    unsetenv("COHORT_SHM_DIR");
  }

 private:
  std::string path_;
};

template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return p_; }
  void upload(const std::vector<T>& host, size_t at = 0) const {
    ASSERT_LE(at + host.size(), n_);
    ASSERT_EQ(cudaMemcpy(p_ + at, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  // After everything enqueued on `stream`.
  std::vector<T> download(cudaStream_t stream) const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  size_t n_;
  T* p_ = nullptr;
};

// Rank r's element i: a small integer in [-11, 11].
float value(int rank, size_t i) { return static_cast<float>(static_cast<int>((i * 7 + rank * 13) % 23) - 11); }

std::vector<float> values(int rank, size_t n, size_t from = 0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = value(rank, from + i);
  return v;
}

float sumOver(int nranks, size_t i) {
  float s = 0;
  for (int r = 0; r < nranks; ++r) s += value(r, i);
  return s;
}

// NCCL's ncclAvg of floats: each value premultiplied by 1/nranks, then summed in rank order.
float ncclAvgOver(int nranks, size_t i) {
  const float scale = static_cast<float>(1.0 / nranks);
  float acc = __fmul_rn(value(0, i), scale);
  for (int r = 1; r < nranks; ++r) acc = __fadd_rn(acc, __fmul_rn(value(r, i), scale));
  return acc;
}

template <class T>
uint64_t digestOf(const std::vector<T>& v) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(T); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

// Polls ncclCommGetAsyncError while it says `whileState`, up to `bound`; returns the state then.
ncclResult_t pollWhile(ncclComm_t comm, ncclResult_t whileState, std::chrono::milliseconds bound) {
  const Clock::time_point deadline = Clock::now() + bound;
  ncclResult_t state = whileState;
  while (state == whileState && Clock::now() < deadline) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state == whileState) std::this_thread::sleep_for(200us);
  }
  return state;
}

// Waits (bounded) until a flag of the board is set.
bool awaitFlag(const std::atomic<int>& flag) {
  const Clock::time_point deadline = Clock::now() + kFailureBound;
  while (flag.load() == 0) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

ncclComm_t joinComm(int nranks, const ncclUniqueId& id, int rank, bool blocking) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking ? 1 : 0;
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (!blocking) {
    EXPECT_EQ(result, ncclInProgress);
    result = pollWhile(comm, ncclInProgress, kFailureBound);
  }
  EXPECT_EQ(result, ncclSuccess) << ncclGetLastError(comm);
  return comm;
}

// One forked rank: on cuda:<rank> (unless the run says otherwise), with a stream of its own.
struct Rank {
  int rank = 0;
  int nranks = 0;
  ncclUniqueId id{};
  cudaStream_t stream = nullptr;
  ncclComm_t comm = nullptr;  // the body sets it null once it has aborted it
};

struct RunOptions {
  bool join = true;  // the harness creates the communicator (else the body does)
  bool blocking = true;
  bool sameGpu = false;  // every rank on cuda:0
};

// Exits the child: 0 when no expectation failed. The body's comm, still set, is finalized and destroyed.
[[noreturn]] void runChild(Rank& r, const std::function<void(Rank&)>& body, const RunOptions& options) {
  EXPECT_EQ(cudaSetDevice(options.sameGpu ? 0 : r.rank), cudaSuccess);
  EXPECT_EQ(cudaStreamCreate(&r.stream), cudaSuccess);
  if (options.join) r.comm = joinComm(r.nranks, r.id, r.rank, options.blocking);
  if (!::testing::Test::HasFailure()) body(r);
  if (r.comm) {
    const ncclResult_t finalized = ncclCommFinalize(r.comm);
    EXPECT_TRUE(finalized == ncclSuccess || finalized == ncclInProgress) << finalized;
    EXPECT_EQ(pollWhile(r.comm, ncclInProgress, kFailureBound), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(r.comm), ncclSuccess);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(::testing::Test::HasFailure() ? 1 : 0);
}

// Forks `nranks` ranks running `body` and waits for them (bounded: the stragglers are killed).
void runRanks(int nranks, const std::function<void(Rank&)>& body, RunOptions options = {}) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < nranks; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      Rank r{.rank = rank, .nranks = nranks, .id = id};
      runChild(r, body, options);
    }
    pids.push_back(pid);
  }
  const Clock::time_point deadline = Clock::now() + kRunDeadline;
  std::vector<int> status(pids.size(), -1);
  for (size_t left = pids.size(); left > 0;) {
    for (size_t k = 0; k < pids.size(); ++k) {
      if (status[k] != -1 || waitpid(pids[k], &status[k], WNOHANG) != pids[k]) continue;
      --left;
    }
    if (left > 0 && Clock::now() >= deadline) {
      for (size_t k = 0; k < pids.size(); ++k) {
        if (status[k] != -1) continue;
        ADD_FAILURE() << "rank " << k << " did not exit within the run's deadline";
        kill(pids[k], SIGKILL);
        waitpid(pids[k], &status[k], 0);
      }
      break;
    }
    if (left > 0) std::this_thread::sleep_for(1ms);
  }
  for (size_t k = 0; k < pids.size(); ++k) {
    EXPECT_TRUE(WIFEXITED(status[k]) && WEXITSTATUS(status[k]) == 0)
        << "rank " << k << " failed (status " << status[k] << ")";
  }
}

void expectSameDigests(const SharedBoard& board, int nranks, int cases) {
  for (int c = 0; c < cases; ++c) {
    for (int r = 1; r < nranks; ++r)
      EXPECT_EQ(board->digest[r][c], board->digest[0][c]) << "case " << c << ", rank " << r;
  }
}

TEST(CudasimNccl, AllReduceSumAndAvgGiveTheSameBitsOnEveryRank) {
  ShmDir shm;
  const std::vector<size_t> counts = {1, 1001, kAcrossSlots};
  for (int nranks : {2, 3}) {
    SharedBoard board;
    runRanks(nranks, [&](Rank& r) {
      int c = 0;
      for (ncclRedOp_t op : {ncclSum, ncclAvg}) {
        for (size_t count : counts) {
          DeviceArray<float> in(count), out(count);
          in.upload(values(r.rank, count));
          ASSERT_EQ(ncclAllReduce(in.get(), out.get(), count, ncclFloat, op, r.comm, r.stream), ncclSuccess);
          const std::vector<float> got = out.download(r.stream);
          for (size_t i = 0; i < count; ++i) {
            const float mean = sumOver(nranks, i) / static_cast<float>(nranks);
            const float want = op == ncclSum ? sumOver(nranks, i) : ncclAvgOver(nranks, i);
            ASSERT_EQ(got[i], want) << "op " << op << ", count " << count << ", element " << i;
            if (op == ncclAvg) ASSERT_NEAR(got[i], mean, 1e-5f);
          }
          board->digest[r.rank][c++] = digestOf(got);
        }
      }
    });
    expectSameDigests(board, nranks, 2 * static_cast<int>(counts.size()));
  }
}

TEST(CudasimNccl, OtherReductionsAndTypes) {
  ShmDir shm;
  constexpr int kRanks = 3;
  constexpr size_t kCount = 513;
  runRanks(kRanks, [&](Rank& r) {
    DeviceArray<float> in(kCount), out(kCount);
    in.upload(values(r.rank, kCount));
    for (ncclRedOp_t op : {ncclMax, ncclMin, ncclProd}) {
      ASSERT_EQ(ncclAllReduce(in.get(), out.get(), kCount, ncclFloat, op, r.comm, r.stream), ncclSuccess);
      const std::vector<float> got = out.download(r.stream);
      for (size_t i = 0; i < kCount; ++i) {
        float want = value(0, i);
        for (int p = 1; p < kRanks; ++p) {
          const float v = value(p, i);
          want = op == ncclMax ? std::max(want, v) : op == ncclMin ? std::min(want, v) : want * v;
        }
        ASSERT_EQ(got[i], want) << "op " << op << ", element " << i;
      }
    }
    // Integers: the sum, and ncclAvg as the sum divided (truncating) by the ranks.
    DeviceArray<int32_t> ints(kCount), intsOut(kCount);
    std::vector<int32_t> mine(kCount);
    for (size_t i = 0; i < kCount; ++i) mine[i] = static_cast<int32_t>(value(r.rank, i));
    ints.upload(mine);
    for (ncclRedOp_t op : {ncclSum, ncclAvg}) {
      ASSERT_EQ(ncclAllReduce(ints.get(), intsOut.get(), kCount, ncclInt32, op, r.comm, r.stream), ncclSuccess);
      const std::vector<int32_t> got = intsOut.download(r.stream);
      for (size_t i = 0; i < kCount; ++i) {
        const auto sum = static_cast<int32_t>(sumOver(kRanks, i));
        ASSERT_EQ(got[i], op == ncclSum ? sum : sum / kRanks) << "op " << op << ", element " << i;
      }
    }
    DeviceArray<double> doubles(kCount);
    std::vector<double> mineD(kCount);
    for (size_t i = 0; i < kCount; ++i) mineD[i] = value(r.rank, i) * 0.5;
    doubles.upload(mineD);
    ASSERT_EQ(ncclAllReduce(doubles.get(), doubles.get(), kCount, ncclDouble, ncclSum, r.comm, r.stream), ncclSuccess);
    const std::vector<double> got = doubles.download(r.stream);
    for (size_t i = 0; i < kCount; ++i) ASSERT_EQ(got[i], sumOver(kRanks, i) * 0.5) << i;
  });
}

TEST(CudasimNccl, InPlaceAllReduce) {
  ShmDir shm;
  SharedBoard board;
  constexpr int kRanks = 3;
  runRanks(kRanks, [&](Rank& r) {
    DeviceArray<float> data(kAcrossSlots);
    data.upload(values(r.rank, kAcrossSlots));
    ASSERT_EQ(ncclAllReduce(data.get(), data.get(), kAcrossSlots, ncclFloat, ncclSum, r.comm, r.stream), ncclSuccess);
    const std::vector<float> got = data.download(r.stream);
    for (size_t i = 0; i < kAcrossSlots; ++i) ASSERT_EQ(got[i], sumOver(kRanks, i)) << i;
    board->digest[r.rank][0] = digestOf(got);
  });
  expectSameDigests(board, kRanks, 1);
}

TEST(CudasimNccl, ReduceScatterOutOfPlaceAndInPlace) {
  ShmDir shm;
  constexpr int kRanks = 3;
  runRanks(kRanks, [&](Rank& r) {
    for (size_t count : {size_t{1}, size_t{1001}, kAcrossSlots / 3 + 7}) {
      const size_t total = count * kRanks;
      const size_t mine = static_cast<size_t>(r.rank) * count;
      DeviceArray<float> in(total), out(count);
      in.upload(values(r.rank, total));
      ASSERT_EQ(ncclReduceScatter(in.get(), out.get(), count, ncclFloat, ncclSum, r.comm, r.stream), ncclSuccess);
      const std::vector<float> got = out.download(r.stream);
      for (size_t j = 0; j < count; ++j) ASSERT_EQ(got[j], sumOver(kRanks, mine + j)) << "count " << count << ", " << j;
      // In place: NCCL's result lands in this rank's chunk of the input.
      ASSERT_EQ(ncclReduceScatter(in.get(), in.get() + mine, count, ncclFloat, ncclSum, r.comm, r.stream), ncclSuccess);
      const std::vector<float> inPlace = in.download(r.stream);
      for (size_t j = 0; j < count; ++j) ASSERT_EQ(inPlace[mine + j], sumOver(kRanks, mine + j)) << "in place, " << j;
    }
  });
}

TEST(CudasimNccl, AllGatherOutOfPlaceAndInPlace) {
  ShmDir shm;
  constexpr int kRanks = 3;
  runRanks(kRanks, [&](Rank& r) {
    for (size_t count : {size_t{1}, size_t{1001}, kAcrossSlots}) {
      DeviceArray<float> in(count), out(count * kRanks), inPlace(count * kRanks);
      in.upload(values(r.rank, count));
      ASSERT_EQ(ncclAllGather(in.get(), out.get(), count, ncclFloat, r.comm, r.stream), ncclSuccess);
      // In place: this rank's piece already sits at its chunk of the output.
      inPlace.upload(values(r.rank, count), static_cast<size_t>(r.rank) * count);
      float* chunk = inPlace.get() + static_cast<size_t>(r.rank) * count;
      ASSERT_EQ(ncclAllGather(chunk, inPlace.get(), count, ncclFloat, r.comm, r.stream), ncclSuccess);
      const std::vector<float> got = out.download(r.stream);
      const std::vector<float> gotInPlace = inPlace.download(r.stream);
      for (int p = 0; p < kRanks; ++p) {
        for (size_t j = 0; j < count; ++j) {
          ASSERT_EQ(got[static_cast<size_t>(p) * count + j], value(p, j)) << "count " << count << ", rank " << p;
          ASSERT_EQ(gotInPlace[static_cast<size_t>(p) * count + j], value(p, j)) << "in place, rank " << p;
        }
      }
    }
  });
}

TEST(CudasimNccl, BroadcastFromRankOne) {
  ShmDir shm;
  constexpr int kRoot = 1;
  runRanks(3, [&](Rank& r) {
    for (size_t count : {size_t{1}, kAcrossSlots}) {
      DeviceArray<float> in(count), out(count), data(count);
      in.upload(values(r.rank, count));
      data.upload(values(r.rank, count, 5));
      // sendbuff is read on the root only.
      const float* send = r.rank == kRoot ? in.get() : nullptr;
      ASSERT_EQ(ncclBroadcast(send, out.get(), count, ncclFloat, kRoot, r.comm, r.stream), ncclSuccess);
      ASSERT_EQ(ncclBroadcast(data.get(), data.get(), count, ncclFloat, kRoot, r.comm, r.stream), ncclSuccess);
      const std::vector<float> got = out.download(r.stream);
      const std::vector<float> gotInPlace = data.download(r.stream);
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(got[i], value(kRoot, i)) << i;
        ASSERT_EQ(gotInPlace[i], value(kRoot, i + 5)) << "in place, " << i;
      }
    }
  });
}

// Rank 1 starts joining only once rank 0 has seen ncclInProgress, so rank 0 must see it.
TEST(CudasimNccl, NonBlockingInitPassesThroughInProgress) {
  ShmDir shm;
  SharedBoard board;
  runRanks(2,
           [&](Rank& r) {
             if (r.rank == 1) ASSERT_TRUE(awaitFlag(board->flag[0])) << "rank 0 never reported ncclInProgress";
             ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
             config.blocking = 0;
             ASSERT_EQ(ncclCommInitRankConfig(&r.comm, r.nranks, r.id, r.rank, &config), ncclInProgress);
             ncclResult_t state = ncclSuccess;
             ASSERT_EQ(ncclCommGetAsyncError(r.comm, &state), ncclSuccess);
             if (r.rank == 0) {
               EXPECT_EQ(state, ncclInProgress);
               board->flag[0] = 1;
             }
             ASSERT_EQ(pollWhile(r.comm, ncclInProgress, kFailureBound), ncclSuccess) << ncclGetLastError(r.comm);
             DeviceArray<float> x(1);
             x.upload({static_cast<float>(r.rank + 1)});
             ASSERT_EQ(ncclAllReduce(x.get(), x.get(), 1, ncclFloat, ncclSum, r.comm, r.stream), ncclSuccess);
             EXPECT_EQ(x.download(r.stream)[0], 3.0f);
           },
           {.join = false});
}

// 60 collectives of every kind and many sizes, issued without waiting; matched by issue order.
TEST(CudasimNccl, ManyCollectivesRunInIssueOrder) {
  ShmDir shm;
  constexpr int kRanks = 3;
  constexpr int kCollectives = 60;
  runRanks(kRanks,
           [&](Rank& r) {
             std::vector<std::unique_ptr<DeviceArray<float>>> ins, outs;
             std::vector<size_t> counts;
             for (int k = 0; k < kCollectives; ++k) {
               const size_t count = 1 + static_cast<size_t>(k * 997 % 5003) + (k % 20 == 0 ? kAcrossSlots : 0);
               const size_t from = static_cast<size_t>(k) * 31;
               counts.push_back(count);
               const bool gathers = k % 4 == 1, scatters = k % 4 == 3;
               ins.push_back(std::make_unique<DeviceArray<float>>(scatters ? count * kRanks : count));
               outs.push_back(std::make_unique<DeviceArray<float>>(gathers ? count * kRanks : count));
               ins.back()->upload(values(r.rank, scatters ? count * kRanks : count, from));
               float* in = ins.back()->get();
               float* out = outs.back()->get();
               ncclResult_t issued = ncclSuccess;
               switch (k % 4) {
                 case 0:
                   issued = ncclAllReduce(in, out, count, ncclFloat, ncclSum, r.comm, r.stream);
                   break;
                 case 1:
                   issued = ncclAllGather(in, out, count, ncclFloat, r.comm, r.stream);
                   break;
                 case 2:
                   issued = ncclBroadcast(in, out, count, ncclFloat, k % kRanks, r.comm, r.stream);
                   break;
                 case 3:
                   issued = ncclReduceScatter(in, out, count, ncclFloat, ncclSum, r.comm, r.stream);
                   break;
               }
               ASSERT_EQ(issued, ncclSuccess) << "collective " << k;
             }
             for (int k = 0; k < kCollectives; ++k) {
               const size_t count = counts[static_cast<size_t>(k)];
               const size_t from = static_cast<size_t>(k) * 31;
               const std::vector<float> got = outs[static_cast<size_t>(k)]->download(r.stream);
               for (size_t i = 0; i < got.size(); ++i) {
                 float want = 0;
                 switch (k % 4) {
                   case 0:
                     want = sumOver(kRanks, from + i);
                     break;
                   case 1:
                     want = value(static_cast<int>(i / count), from + i % count);
                     break;
                   case 2:
                     want = value(k % kRanks, from + i);
                     break;
                   case 3:
                     want = sumOver(kRanks, from + static_cast<size_t>(r.rank) * count + i);
                     break;
                 }
                 ASSERT_EQ(got[i], want) << "collective " << k << ", element " << i;
               }
             }
           },
           {.blocking = false});
}

// What a surviving rank sees when a peer is gone: its all-reduce stops with ncclRemoteError whose
// message holds `mentions`, later calls fail, ncclCommAbort returns at once and the stream drains.
void expectCollectiveFailsFor(Rank& r, const std::string& mentions) {
  constexpr size_t kCount = 1001;
  DeviceArray<float> x(kCount);
  x.upload(values(r.rank, kCount));
  ASSERT_EQ(ncclAllReduce(x.get(), x.get(), kCount, ncclFloat, ncclSum, r.comm, r.stream), ncclSuccess);
  EXPECT_EQ(pollWhile(r.comm, ncclSuccess, kFailureBound), ncclRemoteError);
  const std::string message = ncclGetLastError(r.comm);
  EXPECT_NE(message.find(mentions), std::string::npos) << message;
  EXPECT_EQ(ncclAllReduce(x.get(), x.get(), kCount, ncclFloat, ncclSum, r.comm, r.stream), ncclRemoteError);
  const Clock::time_point start = Clock::now();
  EXPECT_EQ(ncclCommAbort(r.comm), ncclSuccess);
  EXPECT_LT(Clock::now() - start, 1s);
  r.comm = nullptr;
  EXPECT_EQ(cudaStreamSynchronize(r.stream), cudaSuccess);
}

// Rank 2 joins and exits without a word.
TEST(CudasimNccl, APeerThatExitsFailsTheOthersCollective) {
  ShmDir shm;
  runRanks(3, [&](Rank& r) {
    if (r.rank == 2) _exit(0);
    expectCollectiveFailsFor(r, "rank 2 (pid ");
  });
}

// Rank 0 aborts without taking part.
TEST(CudasimNccl, APeerThatAbortsFailsTheOthersCollective) {
  ShmDir shm;
  runRanks(2, [&](Rank& r) {
    if (r.rank == 1) return expectCollectiveFailsFor(r, "rank 0 aborted its communicator");
    EXPECT_EQ(ncclCommAbort(r.comm), ncclSuccess);
    r.comm = nullptr;
  });
}

void markReached(void* flag) { static_cast<std::atomic<int>*>(flag)->store(1); }

// Rank 1 never issues the all-reduce, so rank 0's stream waits in it; the host waits on the stream;
// the watchdog's part: ncclCommAbort from another thread, which returns at once and frees both.
TEST(CudasimNccl, AbortFromAnotherThreadStopsAWaitingCollective) {
  ShmDir shm;
  SharedBoard board;
  runRanks(2, [&](Rank& r) {
    if (r.rank == 1) {
      EXPECT_TRUE(awaitFlag(board->flag[0])) << "rank 0 did not finish";
      return;
    }
    std::atomic<int> reached{0};
    DeviceArray<float> x(8);
    x.upload(values(r.rank, 8));
    ASSERT_EQ(cudaLaunchHostFunc(r.stream, markReached, &reached), cudaSuccess);
    ASSERT_EQ(ncclAllReduce(x.get(), x.get(), 8, ncclFloat, ncclSum, r.comm, r.stream), ncclSuccess);
    std::chrono::nanoseconds abortTook{};
    std::thread watchdog([&] {
      while (reached.load() == 0) std::this_thread::yield();  // the all-reduce is next on the stream
      const Clock::time_point start = Clock::now();
      EXPECT_EQ(ncclCommAbort(r.comm), ncclSuccess);
      abortTook = Clock::now() - start;
    });
    EXPECT_EQ(cudaStreamSynchronize(r.stream), cudaSuccess);  // returns once the abort stops the wait
    watchdog.join();
    EXPECT_LT(abortTook, 1s);
    r.comm = nullptr;
    board->flag[0] = 1;
  });
}

TEST(CudasimNccl, TwoRanksOnOneGpuAreRefused) {
  ShmDir shm;
  runRanks(2,
           [&](Rank& r) {
             ncclComm_t comm = nullptr;
             EXPECT_EQ(ncclCommInitRankConfig(&comm, r.nranks, r.id, r.rank, nullptr), ncclInvalidUsage);
             EXPECT_EQ(comm, nullptr);
             const std::string message = ncclGetLastError(nullptr);
             EXPECT_NE(message.find("Duplicate GPU detected: rank 0 and rank 1"), std::string::npos) << message;
           },
           {.join = false, .sameGpu = true});
}

// In this process: a communicator of one rank, and the arguments NCCL refuses.
TEST(CudasimNccl, OneRankCommunicatorAndArgumentErrors) {
  ShmDir shm;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ncclConfig_t unset{};
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &unset), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 2, id, 2, nullptr), ncclInvalidArgument);
  ncclUniqueId madeUp{};
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 1, madeUp, 0, nullptr), ncclInvalidArgument);
  ASSERT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, nullptr), ncclSuccess) << ncclGetLastError(nullptr);

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  DeviceArray<float> x(5), y(5);
  x.upload(values(0, 5));
  EXPECT_EQ(ncclAllReduce(x.get(), y.get(), 5, ncclFloat, ncclAvg, comm, stream), ncclSuccess);
  EXPECT_EQ(y.download(stream), values(0, 5));
  EXPECT_EQ(ncclBroadcast(x.get(), y.get(), 5, ncclFloat, 0, comm, stream), ncclSuccess);
  EXPECT_EQ(y.download(stream), values(0, 5));

  std::vector<float> host(5);
  EXPECT_EQ(ncclAllReduce(host.data(), y.get(), 5, ncclFloat, ncclSum, comm, stream), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("sendbuff"), std::string::npos) << ncclGetLastError(comm);
  EXPECT_EQ(ncclAllReduce(x.get(), y.get(), 6, ncclFloat, ncclSum, comm, stream), ncclInvalidArgument);  // past the end
  EXPECT_EQ(ncclBroadcast(x.get(), y.get(), 5, ncclFloat, 1, comm, stream), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(x.get(), y.get(), 5, ncclHalf, ncclSum, comm, stream), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(x.get(), y.get(), 5, ncclFloat, static_cast<ncclRedOp_t>(9), comm, stream),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, comm, stream), ncclSuccess);  // nothing to do

  EXPECT_EQ(ncclCommFinalize(comm), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(x.get(), y.get(), 5, ncclFloat, ncclSum, comm, stream), ncclInvalidUsage);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  ncclResult_t state;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &state), ncclInvalidArgument);  // gone
  EXPECT_EQ(ncclCommDestroy(comm), ncclInvalidArgument);
  EXPECT_EQ(ncclCommAbort(nullptr), ncclSuccess);
  EXPECT_STREQ(ncclGetErrorString(ncclRemoteError), "remote process exited or there was a network error");
  EXPECT_STREQ(ncclGetErrorString(ncclSuccess), "no error");
  // The stream stays: cudaStreamDestroy can race its worker's exit (cudasim/runtime.cc notifies after unlocking).
}

}  // namespace
