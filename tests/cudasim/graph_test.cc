// cudasim's stream capture and graphs (cudasim/graph.cc): a capture records and runs nothing, a
// launch replays it in order (reading its buffers as they are then), a stream that waits on a
// captured event joins the capture, and what CUDA forbids during a capture fails with CUDA's error
// and invalidates the capture (cudaStreamEndCapture then returns no graph).
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "cuda_runtime.h"
#include "cudasim/sim.h"

namespace {

#define LAUNCH(kernel, grid, block, stream) ::cudasim::Launch(kernel, #kernel, grid, block, 0, stream)

__global__ void axpbKernel(float* data, size_t n, float a, float b) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t{blockDim.x} * gridDim.x) {
    data[i] = a * data[i] + b;
  }
}

constexpr size_t kN = 1000;

struct Fixture {
  Fixture() {
    EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&device, kN * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaHostAlloc(&pinned, kN * sizeof(float), cudaHostAllocDefault), cudaSuccess);
  }
  ~Fixture() {
    cudaStreamSynchronize(stream);
    cudaFreeHost(pinned);
    cudaFree(device);
    cudaStreamDestroy(stream);
    cudaGetLastError();
  }
  std::vector<float> read() {
    std::vector<float> out(kN);
    EXPECT_EQ(cudaMemcpy(out.data(), device, kN * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  void capture() { ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess); }
  // Ends the capture expecting `error` from it and no graph.
  void endFailing(cudaError_t error) {
    cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(1);
    EXPECT_EQ(cudaStreamEndCapture(stream, &graph), error);
    EXPECT_EQ(graph, nullptr);
    cudaGetLastError();
  }
  cudaStream_t stream = nullptr;
  float* device = nullptr;
  float* pinned = nullptr;
};

TEST(CudasimGraph, ACaptureRecordsAndALaunchReplaysInOrder) {
  Fixture f;
  for (size_t i = 0; i < kN; ++i) f.pinned[i] = static_cast<float>(i);
  f.capture();
  cudaStreamCaptureStatus status;
  ASSERT_EQ(cudaStreamIsCapturing(f.stream, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  // The pinned input is read when the graph runs, not when it was captured (a memcpy node).
  ASSERT_EQ(cudaMemcpyAsync(f.device, f.pinned, kN * sizeof(float), cudaMemcpyHostToDevice, f.stream), cudaSuccess);
  LAUNCH(axpbKernel, 4, 128, f.stream)(f.device, kN, 2.0f, 1.0f);
  LAUNCH(axpbKernel, 4, 128, f.stream)(f.device, kN, 1.0f, -3.0f);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(f.stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaStreamIsCapturing(f.stream, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  size_t nodes = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 3u);
  // Nothing ran: the fresh allocation still holds its NaN pattern.
  EXPECT_TRUE(std::isnan(f.read()[0]));
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);  // the instantiated graph does not need it
  for (int launch = 1; launch <= 2; ++launch) {
    for (size_t i = 0; i < kN; ++i) f.pinned[i] = static_cast<float>(i * launch);
    ASSERT_EQ(cudaGraphLaunch(exec, f.stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(f.stream), cudaSuccess);
    const std::vector<float> out = f.read();
    for (size_t i = 0; i < kN; ++i) ASSERT_EQ(out[i], 2.0f * static_cast<float>(i * launch) - 2.0f) << i;
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
}

TEST(CudasimGraph, AStreamThatWaitsOnACapturedEventJoinsTheCapture) {
  Fixture f;
  cudaStream_t side;
  cudaEvent_t fork, join;
  ASSERT_EQ(cudaStreamCreate(&side), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(f.device, 0, kN * sizeof(float), f.stream), cudaSuccess);
  f.capture();
  LAUNCH(axpbKernel, 2, 64, f.stream)(f.device, kN, 1.0f, 5.0f);
  ASSERT_EQ(cudaEventRecord(fork, f.stream), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(fork), cudaErrorCapturedEvent);
  cudaGetLastError();
  ASSERT_EQ(cudaStreamWaitEvent(side, fork, 0), cudaSuccess);
  cudaStreamCaptureStatus status;
  ASSERT_EQ(cudaStreamIsCapturing(side, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  LAUNCH(axpbKernel, 2, 64, side)(f.device, kN, 3.0f, 0.0f);
  ASSERT_EQ(cudaEventRecord(join, side), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(f.stream, join, 0), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(f.stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaStreamIsCapturing(side, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, f.stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(f.stream), cudaSuccess);
  EXPECT_EQ(f.read()[7], 15.0f);  // (0 + 5) * 3: the side stream's kernel after the origin's
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(side);
}

TEST(CudasimGraph, WaitingForTheCapturingStreamInvalidatesTheCapture) {
  Fixture f;
  f.capture();
  LAUNCH(axpbKernel, 1, 32, f.stream)(f.device, kN, 1.0f, 1.0f);
  EXPECT_EQ(cudaStreamSynchronize(f.stream), cudaErrorStreamCaptureUnsupported);
  cudaStreamCaptureStatus status;
  ASSERT_EQ(cudaStreamIsCapturing(f.stream, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
  // Work on an invalidated capture fails and is not run.
  EXPECT_EQ(cudaMemsetAsync(f.device, 0, 4, f.stream), cudaErrorStreamCaptureInvalidated);
  f.endFailing(cudaErrorStreamCaptureInvalidated);
  EXPECT_TRUE(std::isnan(f.read()[0]));
}

TEST(CudasimGraph, ForbiddenCallsFailWithCudasErrorAndInvalidate) {
  const auto expectForbidden = [](const char* what, auto call, cudaError_t error) {
    Fixture f;
    f.capture();
    EXPECT_EQ(call(f), error) << what;
    f.endFailing(cudaErrorStreamCaptureInvalidated);
  };
  std::vector<float> pageable(kN);
  expectForbidden("cudaStreamQuery", [](Fixture& f) { return cudaStreamQuery(f.stream); },
                  cudaErrorStreamCaptureUnsupported);
  expectForbidden("cudaDeviceSynchronize", [](Fixture&) { return cudaDeviceSynchronize(); },
                  cudaErrorStreamCaptureUnsupported);
  expectForbidden("a synchronous cudaMemcpy (a loss read back)",
                  [&](Fixture& f) { return cudaMemcpy(pageable.data(), f.device, 4, cudaMemcpyDeviceToHost); },
                  cudaErrorStreamCaptureUnsupported);
  expectForbidden("an asynchronous copy into pageable memory",
                  [&](Fixture& f) {
                    return cudaMemcpyAsync(pageable.data(), f.device, 4, cudaMemcpyDeviceToHost, f.stream);
                  },
                  cudaErrorStreamCaptureUnsupported);
  expectForbidden("an asynchronous copy from pageable memory",
                  [&](Fixture& f) {
                    return cudaMemcpyAsync(f.device, pageable.data(), 4, cudaMemcpyHostToDevice, f.stream);
                  },
                  cudaErrorStreamCaptureUnsupported);
  expectForbidden("cudaMalloc in global mode",
                  [](Fixture&) {
                    void* p = nullptr;
                    return cudaMalloc(&p, 256);
                  },
                  cudaErrorStreamCaptureUnsupported);
  void* block = nullptr;
  ASSERT_EQ(cudaMalloc(&block, 256), cudaSuccess);
  expectForbidden("cudaFree (it waits for the device)", [&](Fixture&) { return cudaFree(block); },
                  cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(cudaFree(block), cudaSuccess);  // the capture over, it frees
  cudaEvent_t outside;
  ASSERT_EQ(cudaEventCreate(&outside), cudaSuccess);
  expectForbidden("a wait on an event recorded outside the capture",
                  [&](Fixture& f) {
                    EXPECT_EQ(cudaEventRecord(outside, nullptr), cudaSuccess);
                    return cudaStreamWaitEvent(f.stream, outside, 0);
                  },
                  cudaErrorStreamCaptureIsolation);
  cudaEventDestroy(outside);
}

TEST(CudasimGraph, TheCaptureModeDecidesWhereCudaMallocMayRun) {
  Fixture f;
  // Relaxed for this thread (what a caching allocator does around its cudaMalloc): allowed, and
  // the capture goes on.
  f.capture();
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeGlobal);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 256), cudaSuccess);
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(f.stream, &graph), cudaSuccess);
  cudaGraphDestroy(graph);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  // A thread-local capture restrains its own thread only; a global one every thread in global mode.
  for (cudaStreamCaptureMode captureMode : {cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeGlobal}) {
    ASSERT_EQ(cudaStreamBeginCapture(f.stream, captureMode), cudaSuccess);
    cudaError_t other = cudaSuccess;
    void* q = nullptr;
    std::thread([&] { other = cudaMalloc(&q, 256); }).join();
    EXPECT_EQ(other, captureMode == cudaStreamCaptureModeGlobal ? cudaErrorStreamCaptureUnsupported : cudaSuccess);
    if (captureMode == cudaStreamCaptureModeGlobal) {
      f.endFailing(cudaErrorStreamCaptureInvalidated);
    } else {
      ASSERT_EQ(cudaStreamEndCapture(f.stream, &graph), cudaSuccess);
      cudaGraphDestroy(graph);
    }
    if (q) {
      EXPECT_EQ(cudaFree(q), cudaSuccess);
    }
  }
}

TEST(CudasimGraph, MisusedCapturesAreErrors) {
  Fixture f;
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(f.stream, &graph), cudaErrorIllegalState);  // not capturing
  f.capture();
  EXPECT_EQ(cudaStreamBeginCapture(f.stream, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
  cudaError_t wrongThread = cudaSuccess;
  std::thread([&] { wrongThread = cudaStreamEndCapture(f.stream, &graph); }).join();
  EXPECT_EQ(wrongThread, cudaErrorStreamCaptureWrongThread);
  ASSERT_EQ(cudaStreamEndCapture(f.stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  EXPECT_EQ(cudaGraphLaunch(exec, f.stream), cudaSuccess);  // an empty graph runs
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaErrorInvalidResourceHandle);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphLaunch(exec, f.stream), cudaErrorInvalidResourceHandle);
  cudaGetLastError();
}

}  // namespace
