// Stream and Event on the CPU: work is inline, so every wait returns at once. (The CUDA behaviour
// is covered by tests/runtime/cuda/stream_gpu_test.cc.)
#include "runtime/stream.h"

#include <gtest/gtest.h>

#include <chrono>
#include <utility>

#include "runtime/device_query.h"
#include "runtime/error.h"

namespace cohort::runtime {
namespace {

using std::chrono::milliseconds;

TEST(CpuStream, IsInlineAndAlwaysComplete) {
  Stream stream;
  EXPECT_TRUE(stream.device().isCpu());
  EXPECT_EQ(stream.native(), nullptr);
  EXPECT_TRUE(stream.query());
  stream.synchronize(milliseconds(0));  // nothing to wait for, even with no time at all
  stream.synchronize();
  EXPECT_EQ(stream.describe(), "stream 'stream' on cpu");
}

TEST(CpuStream, NameAppearsInDescription) {
  Stream stream(Device::cpu(), {.name = "compute"});
  EXPECT_EQ(stream.name(), "compute");
  EXPECT_EQ(stream.describe(), "stream 'compute' on cpu");
}

TEST(CpuEvent, RecordQueryWaitAreNoOps) {
  Stream producer(Device::cpu(), {.name = "producer"});
  Stream consumer(Device::cpu(), {.name = "consumer"});
  Event event;
  EXPECT_FALSE(event.recorded());
  EXPECT_TRUE(event.query());
  consumer.waitEvent(event);  // an event never recorded is complete
  event.record(producer);
  EXPECT_TRUE(event.recorded());
  EXPECT_TRUE(event.query());
  EXPECT_EQ(event.native(), nullptr);
  EXPECT_TRUE(event.device().isCpu());
  consumer.waitEvent(event);
  event.synchronize(milliseconds(0));
  event.synchronize();
}

TEST(CpuEvent, ElapsedTimeNeedsCudaTimingEvents) {
  Stream stream;
  Event start(EventOptions{.enableTiming = true});
  Event end(EventOptions{.enableTiming = true});
  start.record(stream);
  end.record(stream);
  EXPECT_THROW(start.elapsedMs(end), InvalidArgument);
}

TEST(CpuStream, MovesKeepNameAndDevice) {
  Stream a(Device::cpu(), {.name = "a"});
  Stream b(std::move(a));
  EXPECT_EQ(b.name(), "a");
  EXPECT_TRUE(b.query());
  Stream c;
  c = std::move(b);
  EXPECT_EQ(c.name(), "a");
  Event e1;
  e1.record(c);
  Event e2(std::move(e1));
  EXPECT_TRUE(e2.recorded());
  EXPECT_FALSE(e1.recorded());  // NOLINT(bugprone-use-after-move): moved-from state is specified
}

TEST(CudaStreamWithoutDevice, ConstructionFailsWithAnError) {
  if (!cudaCompiled()) {
    EXPECT_THROW(Stream(Device::cuda(0)), InvalidArgument);
    return;
  }
  if (!cudaDevices().empty()) GTEST_SKIP() << "a CUDA device is present: see stream_gpu_test";
  EXPECT_THROW(Stream(Device::cuda(0)), Error);  // no driver/device: a clear error, not a crash
}

}  // namespace
}  // namespace cohort::runtime
