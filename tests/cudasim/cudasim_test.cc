// cudasim (the emulated CUDA device, cudasim/): kernels run with CUDA's thread model and give the
// CPU's results (barriers, warp shuffles and votes, atomics); and each mistake issue 17 names is
// caught, shown on a deliberately broken kernel or call:
//   - a block reduction whose barrier is removed reads other threads' shared memory unwritten;
//   - a launch whose grid misses the last elements leaves them NaN (fresh device memory);
//   - a kernel reading a copy's destination without waiting for the copy's event sees it unwritten;
//   - a buffer a pool hands out again while a kernel on another stream still reads it (freed without
//     waiting for that stream) is overwritten under the kernel;
//   - a kernel writing past its buffer is reported when the buffer is freed;
//   - freed device memory faults when touched;
//   - an IPC handle opened after its owner freed the memory fails;
//   - a bad launch configuration is cudaErrorInvalidConfiguration;
//   - an allocation beyond the device's memory (COHORT_CUDASIM_MEMORY_MB) fails.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "cuda_runtime.h"
#include "cudasim/sim.h"

namespace {

constexpr unsigned kThreads = 256;

#define LAUNCH(kernel, grid, block, stream) ::cudasim::Launch(kernel, #kernel, grid, block, 0, stream)

__global__ void scaleKernel(float* data, size_t n, float alpha) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) data[i] *= alpha;
}

// Σ over the block in shared memory: with or without the barrier after the first store.
template <bool kBarrier>
__global__ void blockSumKernel(const float* x, float* out, size_t n) {
  __shared__ float partial[kThreads];
  float v = 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<size_t>(blockDim.x) * gridDim.x) v += x[i];
  partial[threadIdx.x] = v;
  if (kBarrier) __syncthreads();
  for (unsigned half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, partial[0]);
}

// Σ over each warp with shuffles, then the warps' sums added atomically.
__global__ void warpSumKernel(const float* x, float* out, size_t n) {
  float v = 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<size_t>(blockDim.x) * gridDim.x) v += x[i];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) atomicAdd(out, v);
}

__global__ void writeOnePastKernel(float* data, size_t n) {
  if (threadIdx.x == 0 && blockIdx.x == 0) data[n] = 1.0f;
}

// Warp votes: lane 0 of each warp writes the ballot of (lane % 3 == 0), whether any lane is 31 and
// whether all lanes are below 32.
__global__ void voteKernel(unsigned* out) {
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned ballot = __ballot_sync(0xffffffffu, lane % 3 == 0);
  const int any = __any_sync(0xffffffffu, lane == 31), all = __all_sync(0xffffffffu, lane < 32);
  const int none = __any_sync(0xffffffffu, lane > 40);
  if (lane == 0) {
    out[warp * 4] = ballot;
    out[warp * 4 + 1] = static_cast<unsigned>(any);
    out[warp * 4 + 2] = static_cast<unsigned>(all);
    out[warp * 4 + 3] = static_cast<unsigned>(none);
  }
}

class Device {
 public:
  explicit Device(size_t n) : n_(n) { EXPECT_EQ(cudaMalloc(&p_, n * sizeof(float)), cudaSuccess); }
  ~Device() { cudaFree(p_); }
  float* get() const { return p_; }
  void upload(const std::vector<float>& v) const {
    ASSERT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<float> download() const {
    std::vector<float> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  size_t n_;
  float* p_ = nullptr;
};

std::vector<float> ones(size_t n) { return std::vector<float>(n, 1.0f); }

TEST(Cudasim, AGridStrideKernelMatchesTheCpu) {
  const size_t n = 10007;
  Device d(n);
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  d.upload(v);
  LAUNCH(scaleKernel, 7, 128, nullptr)(d.get(), n, 0.5f);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<float> got = d.download();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], v[i] * 0.5f) << i;
}

TEST(Cudasim, WarpVotesSeeEveryLane) {
  unsigned* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 2 * 4 * sizeof(unsigned)), cudaSuccess);
  LAUNCH(voteKernel, 1, 64, nullptr)(out);
  unsigned host[8];
  ASSERT_EQ(cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
  unsigned expected = 0;
  for (unsigned lane = 0; lane < 32; lane += 3) expected |= 1u << lane;
  for (int warp = 0; warp < 2; ++warp) {
    EXPECT_EQ(host[warp * 4], expected) << warp;
    EXPECT_EQ(host[warp * 4 + 1], 1u) << warp;
    EXPECT_EQ(host[warp * 4 + 2], 1u) << warp;
    EXPECT_EQ(host[warp * 4 + 3], 0u) << warp;
  }
  cudaFree(out);
}

TEST(Cudasim, BarriersAndShufflesReduceCorrectly) {
  const size_t n = 5000;
  Device x(n), out(1);
  x.upload(ones(n));
  for (int run = 0; run < 5; ++run) {
    out.upload({0.0f});
    LAUNCH(blockSumKernel<true>, 3, kThreads, nullptr)(x.get(), out.get(), n);
    EXPECT_EQ(out.download()[0], 5000.0f);
    out.upload({0.0f});
    LAUNCH(warpSumKernel, 3, kThreads, nullptr)(x.get(), out.get(), n);
    EXPECT_EQ(out.download()[0], 5000.0f);
  }
}

// The barrier removed: some thread adds a partner's slot before the partner stored it, in the
// shuffled order of at least one of a few launches.
TEST(Cudasim, AMissingBarrierIsCaught) {
  const size_t n = 5000;
  Device x(n), out(1);
  x.upload(ones(n));
  int wrong = 0;
  for (int run = 0; run < 5; ++run) {
    out.upload({0.0f});
    LAUNCH(blockSumKernel<false>, 3, kThreads, nullptr)(x.get(), out.get(), n);
    wrong += out.download()[0] != 5000.0f;
  }
  EXPECT_GT(wrong, 0) << "the race went unnoticed in every run";
}

// A grid sized for n - 1 elements without a grid-stride loop: the last element stays as cudaMalloc
// left it, NaN.
__global__ void oneEachKernel(float* data, size_t n) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) data[i] = 2.0f;
}

TEST(Cudasim, AGridThatMissesTheLastElementsLeavesThemNaN) {
  const size_t n = 1000;
  Device d(n);
  LAUNCH(oneEachKernel, (n - 1) / 128, 128, nullptr)(d.get(), n);  // 7 blocks: 896 elements
  std::vector<float> got = d.download();
  EXPECT_EQ(got[0], 2.0f);
  EXPECT_TRUE(std::isnan(got[n - 1]));
}

// A copy on one stream, a kernel reading its destination on another: without the event wait the
// kernel sometimes runs first (random delays); with it, never.
TEST(Cudasim, AKernelThatDoesNotWaitForACopysEventSeesItUnwritten) {
  const size_t n = 4096;
  float* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, n * sizeof(float), cudaHostAllocDefault), cudaSuccess);
  for (size_t i = 0; i < n; ++i) pinned[i] = 1.0f;
  cudaStream_t copies, compute;
  cudaEvent_t copied;
  ASSERT_EQ(cudaStreamCreateWithFlags(&copies, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), cudaSuccess);
  Device x(n), out(1);
  int wrongWithout = 0, wrongWith = 0;
  for (int run = 0; run < 20; ++run) {
    for (bool wait : {false, true}) {
      ASSERT_EQ(cudaMemset(x.get(), 0xFF, n * sizeof(float)), cudaSuccess);  // NaN: "not copied yet"
      out.upload({0.0f});
      ASSERT_EQ(cudaMemcpyAsync(x.get(), pinned, n * sizeof(float), cudaMemcpyHostToDevice, copies), cudaSuccess);
      ASSERT_EQ(cudaEventRecord(copied, copies), cudaSuccess);
      if (wait) ASSERT_EQ(cudaStreamWaitEvent(compute, copied, 0), cudaSuccess);
      LAUNCH(warpSumKernel, 2, kThreads, compute)(x.get(), out.get(), n);
      ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(copies), cudaSuccess);
      (wait ? wrongWith : wrongWithout) += out.download()[0] != static_cast<float>(n);
    }
  }
  EXPECT_GT(wrongWithout, 0) << "the missing wait went unnoticed in every run";
  EXPECT_EQ(wrongWith, 0);
  cudaEventDestroy(copied);
  cudaStreamDestroy(copies);
  cudaStreamDestroy(compute);
  cudaFreeHost(pinned);
}

// A pool (like a caching allocator) that reuses a freed block at once: a kernel on the compute stream
// still reads the block when the next owner's copy on another stream overwrites it. Recording an
// event on the compute stream at the free, and making the next owner's stream wait for it (what
// Cohort's caching allocator does for blocks used on other streams), makes it right every time.
TEST(Cudasim, ABufferReusedWhileAStreamStillReadsItIsCaught) {
  const size_t n = 4096;
  cudaStream_t compute, copies;
  cudaEvent_t released;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&copies, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&released, cudaEventDisableTiming), cudaSuccess);
  std::vector<float> twos(n, 2.0f);
  Device block(n), out(1);  // the pool's one block, and the reader's result
  int wrongWithout = 0, wrongWith = 0;
  for (int run = 0; run < 20; ++run) {
    for (bool waitForRelease : {false, true}) {
      block.upload(ones(n));  // the first owner's data (synchronous)
      out.upload({0.0f});
      LAUNCH(warpSumKernel, 2, kThreads, compute)(block.get(), out.get(), n);  // the first owner reads it...
      ASSERT_EQ(cudaEventRecord(released, compute), cudaSuccess);             // ...and frees it to the pool here
      if (waitForRelease) ASSERT_EQ(cudaStreamWaitEvent(copies, released, 0), cudaSuccess);
      // The next owner gets the same block and fills it on its own stream (pageable source: staged).
      ASSERT_EQ(cudaMemcpyAsync(block.get(), twos.data(), n * sizeof(float), cudaMemcpyHostToDevice, copies), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(copies), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
      (waitForRelease ? wrongWith : wrongWithout) += out.download()[0] != static_cast<float>(n);
    }
  }
  EXPECT_GT(wrongWithout, 0) << "the reuse under a running kernel went unnoticed in every run";
  EXPECT_EQ(wrongWith, 0);
  cudaEventDestroy(released);
  cudaStreamDestroy(copies);
  cudaStreamDestroy(compute);
}

TEST(CudasimDeathTest, AWritePastTheBufferIsReportedWhenItIsFreed) {
  EXPECT_DEATH(
      {
        float* p = nullptr;
        cudaMalloc(&p, 100 * sizeof(float));
        LAUNCH(writeOnePastKernel, 1, 32, nullptr)(p, 100);
        cudaFree(p);
      },
      "written past its bounds");
}

TEST(CudasimDeathTest, FreedDeviceMemoryFaultsWhenTouched) {
  EXPECT_DEATH(
      {
        float* p = nullptr;
        cudaMalloc(&p, 100 * sizeof(float));
        cudaFree(p);
        LAUNCH(scaleKernel, 1, 32, nullptr)(p, 100, 2.0f);
        cudaDeviceSynchronize();
      },
      "");
}

TEST(Cudasim, AnIpcHandleOpensInAnotherProcessUntilTheOwnerFreesTheMemory) {
  float* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 64 * sizeof(float)), cudaSuccess);
  std::vector<float> v(64, 3.0f);
  ASSERT_EQ(cudaMemcpy(p, v.data(), sizeof(float) * 64, cudaMemcpyHostToDevice), cudaSuccess);
  cudaIpcMemHandle_t handle;
  ASSERT_EQ(cudaIpcGetMemHandle(&handle, p), cudaSuccess);
  void* mine = nullptr;
  EXPECT_EQ(cudaIpcOpenMemHandle(&mine, handle, cudaIpcMemLazyEnablePeerAccess), cudaErrorInvalidContext);
  // In a child: open, read what the owner wrote, write for the owner to read.
  auto child = [&](bool expectOpen) {
    pid_t pid = fork();
    if (pid == 0) {
      void* q = nullptr;
      cudaError_t e = cudaIpcOpenMemHandle(&q, handle, cudaIpcMemLazyEnablePeerAccess);
      if (!expectOpen) _exit(e == cudaSuccess ? 1 : 0);
      if (e != cudaSuccess) _exit(2);
      float x = 0;
      if (cudaMemcpy(&x, q, sizeof x, cudaMemcpyDeviceToHost) != cudaSuccess || x != 3.0f) _exit(3);
      float y = 7.0f;
      if (cudaMemcpy(static_cast<float*>(q) + 1, &y, sizeof y, cudaMemcpyHostToDevice) != cudaSuccess) _exit(4);
      if (cudaIpcCloseMemHandle(q) != cudaSuccess) _exit(5);
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
  };
  EXPECT_EQ(child(true), 0);
  float y = 0;
  ASSERT_EQ(cudaMemcpy(&y, p + 1, sizeof y, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(y, 7.0f);
  ASSERT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(child(false), 0) << "a handle opened after its owner freed the memory";
}

// A device's memory is COHORT_CUDASIM_MEMORY_MB (2048 MiB unless set): cudaMemGetInfo reports it,
// less what this process holds, and an allocation beyond what is free fails as a GPU's does
// (cudaErrorMemoryAllocation), taking nothing: a test that trains within the emulated memory (the
// 512 MiB run of cli_zero_gpu_memory_test) would fail if it went beyond.
TEST(Cudasim, AnAllocationBeyondTheDevicesMemoryFails) {
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  EXPECT_GT(total, size_t{0});
  EXPECT_LE(free0, total);
  void* held = nullptr;
  ASSERT_EQ(cudaMalloc(&held, size_t{1} << 20), cudaSuccess);
  size_t free1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_EQ(free1, free0 - (size_t{1} << 20));
  void* tooMuch = nullptr;
  EXPECT_EQ(cudaMalloc(&tooMuch, free1 + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(tooMuch, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  size_t free2 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free2, &total), cudaSuccess);
  EXPECT_EQ(free2, free1);
  ASSERT_EQ(cudaFree(held), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&free2, &total), cudaSuccess);
  EXPECT_EQ(free2, free0);
}

TEST(Cudasim, BadLaunchesAndCallsAreErrors) {
  Device d(10);
  LAUNCH(scaleKernel, 1, 2048, nullptr)(d.get(), 10, 1.0f);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read and cleared
  LAUNCH(scaleKernel, 0, 32, nullptr)(d.get(), 10, 1.0f);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  float host[20];
  EXPECT_EQ(cudaMemcpy(d.get(), host, sizeof host, cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // past the end
  EXPECT_EQ(cudaMemcpy(host, d.get(), 4, cudaMemcpyHostToDevice), cudaErrorInvalidMemcpyDirection);
  EXPECT_EQ(cudaFree(host), cudaErrorInvalidValue);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle);
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  EXPECT_EQ(cudaSetDevice(count), cudaErrorInvalidDevice);
}

}  // namespace
