// Stream and Event on a CUDA device (tags = ["gpu"]): ordering through events, timeouts that name
// the stream, timing. A stream is held busy by a host function that waits for the test to release
// it, so nothing here depends on how fast the GPU is.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "runtime/error.h"
#include "runtime/stream.h"
#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include <cuda_runtime.h>

namespace cohort::runtime {
namespace {

using std::chrono::milliseconds;

// Blocks a stream until release() (or destruction). Declare it before the streams it blocks, so it
// is destroyed after them and the host function never reads a dead flag.
class StreamGate {
 public:
  StreamGate() = default;
  ~StreamGate() {
    release();
    cudaDeviceSynchronize();
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  void block(const Stream& stream) {
    ASSERT_EQ(
        cudaLaunchHostFunc(static_cast<cudaStream_t>(stream.native()), &StreamGate::wait, &open_),
        cudaSuccess);
  }
  void release() { open_.store(true); }

 private:
  static void wait(void* flag) {
    auto* open = static_cast<std::atomic<bool>*>(flag);
    while (!open->load()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::atomic<bool> open_{false};
};

class CudaStreamTest : public ::testing::Test {
 protected:
  void SetUp() override { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }
};

TEST_F(CudaStreamTest, OwnsANonBlockingStream) {
  Stream stream(Device::cuda(0), {.name = "compute"});
  ASSERT_NE(stream.native(), nullptr);
  unsigned flags = 0;
  ASSERT_EQ(cudaStreamGetFlags(static_cast<cudaStream_t>(stream.native()), &flags), cudaSuccess);
  EXPECT_EQ(flags & cudaStreamNonBlocking, static_cast<unsigned>(cudaStreamNonBlocking));
  EXPECT_TRUE(stream.query());
  stream.synchronize(milliseconds(1000));
  EXPECT_EQ(stream.describe(), "stream 'compute' on cuda:0");

  Stream moved(std::move(stream));
  EXPECT_NE(moved.native(), nullptr);
  EXPECT_EQ(stream.native(), nullptr);  // NOLINT(bugprone-use-after-move): specified state
  EXPECT_TRUE(stream.device().isCpu());
}

TEST_F(CudaStreamTest, SynchronizeTimesOutNamingTheStream) {
  StreamGate gate;
  Stream busy(Device::cuda(0), {.name = "busy"});
  gate.block(busy);
  EXPECT_FALSE(busy.query());
  try {
    busy.synchronize(milliseconds(20));
    FAIL() << "synchronize returned while the stream was blocked";
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("stream 'busy' on cuda:0"), std::string::npos) << what;
    EXPECT_NE(what.find("20 ms"), std::string::npos) << what;
  }
  gate.release();
  busy.synchronize(milliseconds(10000));
  EXPECT_TRUE(busy.query());
}

TEST_F(CudaStreamTest, EventOrdersAnotherStreamWithoutBlockingTheHost) {
  StreamGate gate;
  Stream producer(Device::cuda(0), {.name = "producer"});
  Stream consumer(Device::cuda(0), {.name = "consumer"});
  void* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 4096), cudaSuccess);

  gate.block(producer);
  Event ready;
  ready.record(producer);
  EXPECT_TRUE(ready.recorded());
  EXPECT_EQ(ready.device(), Device::cuda(0));
  EXPECT_FALSE(ready.query());
  EXPECT_THROW(ready.synchronize(milliseconds(10)), TimeoutError);

  consumer.waitEvent(ready);  // returns at once: the wait is on the GPU
  ASSERT_EQ(cudaMemsetAsync(buffer, 0x7f, 4096, static_cast<cudaStream_t>(consumer.native())),
            cudaSuccess);
  std::this_thread::yield();
  EXPECT_FALSE(consumer.query());  // held behind the producer's event

  gate.release();
  consumer.synchronize(milliseconds(10000));
  EXPECT_TRUE(ready.query());
  unsigned char last = 0;
  ASSERT_EQ(cudaMemcpy(&last, static_cast<char*>(buffer) + 4095, 1, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(last, 0x7f);

  Stream host;  // an inline CPU stream waiting on a CUDA event waits on the host
  host.waitEvent(ready);
  cudaFree(buffer);
}

TEST_F(CudaStreamTest, TimingEventsMeasureElapsedTime) {
  Stream stream(Device::cuda(0), {.name = "timed"});
  void* buffer = nullptr;
  const size_t bytes = size_t{64} << 20;
  ASSERT_EQ(cudaMalloc(&buffer, bytes), cudaSuccess);
  Event start(EventOptions{.enableTiming = true});
  Event end(EventOptions{.enableTiming = true});
  start.record(stream);
  ASSERT_EQ(cudaMemsetAsync(buffer, 1, bytes, static_cast<cudaStream_t>(stream.native())),
            cudaSuccess);
  end.record(stream);
  end.synchronize(milliseconds(10000));
  float ms = start.elapsedMs(end);
  EXPECT_GE(ms, 0.0f);
  EXPECT_LT(ms, 10000.0f);

  Event untimed;
  untimed.record(stream);
  untimed.synchronize(milliseconds(10000));
  EXPECT_THROW(start.elapsedMs(untimed), InvalidArgument);
  cudaFree(buffer);
}

TEST_F(CudaStreamTest, EventStaysOnItsDevice) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (count < 2) GTEST_SKIP() << "needs two CUDA devices, found " << count;
  Stream first(Device::cuda(0));
  Stream second(Device::cuda(1));
  Event event;
  event.record(first);
  EXPECT_THROW(event.record(second), InvalidArgument);
  second.waitEvent(event);  // cross-device waits are allowed
  second.synchronize(milliseconds(10000));
}

}  // namespace
}  // namespace cohort::runtime

#else  // !COHORT_HAVE_CUDA

TEST(CudaStreamTest, NeedsCuda) { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }

#endif
