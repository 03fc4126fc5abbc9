// GradSync against a communicator that records what it is asked to do: bucket layout (module
// boundaries, reverse order, tiling the flat buffer), a bucket's all-reduce starting as soon as its
// units finish backward (before earlier layers' backward; the GPT's blocks too), and finish()
// waiting for all of them.
#include "train/placement/grad_sync.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "nn/loss.h"
#include "nn/model_spec.h"
#include "tests/nn/unit_recorder.h"

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

// Tells GradSync every event and records how many all-reduces had started after each
// after-backward (GradSync's reaction included).
struct StartedAfter {
  StartedAfter(GradSync& sync, RecordingCommunicator& comm) : recorder(&sync) {
    recorder.onEvent = [this, &comm](const std::string& event, const nn::ParamBuffer::Unit&) {
      if (event.rfind("after-backward", 0) == 0) counts.push_back(comm.calls.size());
    };
  }
  nn::testing::UnitRecorder recorder;
  std::vector<size_t> counts;
};

std::unique_ptr<Model> initialisedModel(const std::string& spec) {
  auto model = buildModel(spec);
  model->params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(1);
  model->net->resetParams(rng);
  return model;
}

// One forward and backward of `model` on (x, targets), GradSync told every event; what was recorded.
std::unique_ptr<StartedAfter> trainTelling(GradSync& sync, RecordingCommunicator& comm, Model& model, const Tensor& x,
                                           const Tensor& targets) {
  auto spy = std::make_unique<StartedAfter>(sync, comm);
  Pass pass;
  pass.needInputGrad = false;
  pass.units = &spy->recorder;
  SoftmaxCrossEntropy loss;
  loss.forward(model.net->forward(x, pass), targets);
  model.net->backward(loss.backward(), pass);
  return spy;
}

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
  auto model = initialisedModel("mlp:784,512,256,10");
  RecordingCommunicator comm;
  GradSync sync(comm, model->params, {});
  Tensor x = Tensor::zeros(Shape{8, 784});
  Tensor y = Tensor::zeros(Shape{8});
  for (int step = 0; step < 3; ++step) {
    comm.calls.clear();
    const auto spy = trainTelling(sync, comm, *model, x, y);
    // Backward reports fc2, fc1, fc0 in that order; bucket 0 (fc1 + fc2) starts when fc1 is done,
    // i.e. before fc0's backward, and bucket 1 when fc0 is.
    ASSERT_EQ(spy->counts, (std::vector<size_t>{0, 1, 2})) << "step " << step;
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

// The GPT reports its units during backward (ln_f, h.1, h.0, embeddings), so its buckets start
// while backward goes on, in bucket order: with one module per bucket, ln_f's when ln_f is done,
// each block's six modules when that block is, and only wte's and wpe's at the end.
TEST(GradSync, AGptsBucketsStartWhileBackwardGoesOn) {
  auto model = initialisedModel("gpt:layers=2,heads=2,dim=16,ctx=8,vocab=32");
  RecordingCommunicator comm;
  GradSync sync(comm, model->params, {.bucketBytes = 1, .firstBucketBytes = 1});
  ASSERT_EQ(sync.buckets().size(), 15u);  // ln_f, 2 × 6 modules of a block, wpe, wte
  Tensor ids = Tensor::zeros(Shape{2, 8});
  for (int64_t i = 0; i < ids.numel(); ++i) ids.at(i) = static_cast<float>(i % 32);
  for (int step = 0; step < 2; ++step) {
    comm.calls.clear();
    const auto spy = trainTelling(sync, comm, *model, ids, ids);
    EXPECT_EQ(
        spy->recorder.unitsOf("after-backward"),
        (std::vector<std::string>{"transformer.ln_f", "transformer.h.1", "transformer.h.0", "transformer.embeddings"}));
    EXPECT_EQ(spy->counts, (std::vector<size_t>{1, 7, 13, 15})) << "step " << step;
    sync.finish();
    ASSERT_EQ(comm.calls.size(), 15u) << "finish() started nothing more";
    for (size_t b = 0; b < comm.calls.size(); ++b) {
      EXPECT_EQ(comm.calls[b].data, model->params.grads().data() + sync.buckets()[b].offset) << "bucket " << b;
    }
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
