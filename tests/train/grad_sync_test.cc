// GradSync against a communicator that records what it is asked to do: bucket layout (module
// boundaries, reverse order, tiling the flat buffer), a bucket's all-reduce starting as soon as its
// modules finish backward (before earlier layers' backward), and finish() waiting for all of them.
#include "train/grad_sync.h"

#include <gtest/gtest.h>

#include "nn/loss.h"
#include "nn/model_spec.h"

namespace cohort::train {
namespace {

using collectives::ReduceOp;
using namespace nn;

class RecordingCommunicator final : public collectives::Communicator {
 public:
  struct Call {
    const float* data;
    size_t count;
    ReduceOp op;
  };
  class DoneWork final : public collectives::Work {
   public:
    explicit DoneWork(int* waits) : waits_(waits) {}
    bool done() override { return true; }
    void wait(std::chrono::milliseconds) override { ++*waits_; }

   private:
    int* waits_;
  };

  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "recording"; }
  collectives::WorkPtr allReduce(const void* in, void* out, size_t count, const collectives::AllReduceOptions& o) override {
    EXPECT_EQ(in, out) << "buckets are reduced in place";
    calls.push_back({static_cast<const float*>(in), count, o.op});
    return std::make_unique<DoneWork>(&waits);
  }
  collectives::WorkPtr reduceScatter(const void*, void*, size_t, const collectives::ReduceScatterOptions&) override {
    return nullptr;
  }
  collectives::WorkPtr allGather(const void*, void*, size_t, const collectives::AllGatherOptions&) override {
    return nullptr;
  }
  collectives::WorkPtr broadcast(void* data, size_t count, const collectives::BroadcastOptions& o) override {
    broadcasts.push_back({static_cast<const float*>(data), count, ReduceOp::kSum});
    EXPECT_EQ(o.root, 0);
    return std::make_unique<DoneWork>(&waits);
  }
  collectives::WorkPtr barrier() override { return std::make_unique<DoneWork>(&waits); }

  std::vector<Call> calls, broadcasts;
  int waits = 0;
};

// Records how many all-reduces had started when each module's gradients were reported.
class SpyListener final : public nn::GradReadyListener {
 public:
  SpyListener(GradSync& sync, RecordingCommunicator& comm) : sync_(sync), comm_(comm) {}
  void gradsReady(size_t first, size_t end) override {
    sync_.gradsReady(first, end);
    startedAfter.push_back(comm_.calls.size());
  }
  std::vector<size_t> startedAfter;

 private:
  GradSync& sync_;
  RecordingCommunicator& comm_;
};

TEST(GradSync, BucketsFollowModulesInReverseAndTileTheBuffer) {
  auto model = buildModel("mlp:784,512,256,10");
  model->params.allocate(runtime::cpuAllocator());
  RecordingCommunicator comm;
  GradSync sync(comm, model->params, {});
  const auto& b = sync.buckets();
  ASSERT_EQ(b.size(), 2u);
  // First bucket (1 MiB cap): fc1 and fc2 (about 0.5 MiB); fc0 (1.6 MiB) does not fit, and is never split.
  EXPECT_EQ(b[0].firstEntry, 2u);
  EXPECT_EQ(b[0].endEntry, 6u);
  EXPECT_EQ(b[1].firstEntry, 0u);
  EXPECT_EQ(b[1].endEntry, 2u);
  EXPECT_EQ(b[1].offset, 0u);
  EXPECT_EQ(b[1].offset + b[1].count, b[0].offset);
  EXPECT_EQ(b[0].offset + b[0].count, model->params.numel());
  GradSync small(comm, model->params, {.bucketBytes = 1, .firstBucketBytes = 1});
  EXPECT_EQ(small.buckets().size(), 3u) << "one module per bucket when the cap is tiny";
}

TEST(GradSync, ABucketStartsAsSoonAsItsModulesAreDoneAndFinishWaitsForAll) {
  auto model = buildModel("mlp:784,512,256,10");
  model->params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(1);
  model->net->resetParams(rng);
  RecordingCommunicator comm;
  GradSync sync(comm, model->params, {});
  SpyListener spy(sync, comm);
  Tensor x = Tensor::zeros(Shape{8, 784});
  Tensor y = Tensor::zeros(Shape{8});
  SoftmaxCrossEntropy loss;
  for (int step = 0; step < 3; ++step) {
    comm.calls.clear();
    spy.startedAfter.clear();
    Pass pass;
    pass.needInputGrad = false;
    pass.gradReady = &spy;
    loss.forward(model->net->forward(x, pass), y);
    model->net->backward(loss.backward(), pass);
    // Backward reports fc2, fc1, fc0 in that order; bucket 0 (fc1 + fc2) starts when fc1 is done,
    // i.e. before fc0's backward, and bucket 1 when fc0 is.
    ASSERT_EQ(spy.startedAfter, (std::vector<size_t>{0, 1, 2})) << "step " << step;
    int waitsBefore = comm.waits;
    sync.finish();
    EXPECT_EQ(comm.waits - waitsBefore, 2);
    ASSERT_EQ(comm.calls.size(), 2u);
    EXPECT_EQ(comm.calls[0].data, model->params.grads().data() + sync.buckets()[0].offset);
    EXPECT_EQ(comm.calls[0].count, sync.buckets()[0].count);
    EXPECT_EQ(comm.calls[0].op, ReduceOp::kAvg);
    EXPECT_EQ(comm.calls[1].data, model->params.grads().data());
  }
}

TEST(GradSync, FinishStartsBucketsNobodyReported) {
  auto model = buildModel("mlp:4,3,2");
  model->params.allocate(runtime::cpuAllocator());
  RecordingCommunicator comm;
  GradSync sync(comm, model->params, {});
  sync.finish();
  EXPECT_EQ(comm.calls.size(), sync.buckets().size());
  sync.broadcastParams();
  ASSERT_EQ(comm.broadcasts.size(), 1u);
  EXPECT_EQ(comm.broadcasts[0].count, model->params.numel());
}

}  // namespace
}  // namespace cohort::train
