// AsyncShardWriter (nn/async_shard_writer.h): the copy is taken in submit(), one write in flight,
// errors reach wait(); a staged write is filled by the caller and written after its ready
// function. The writer's thread is held in its beforeWrite hook (or a staged write's ready) where a
// test needs it to be mid-write; nothing sleeps.
#include "nn/async_shard_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <future>

#include "runtime/error.h"
#include "tests/nn/sharded_checkpoint_fixture.h"

namespace cohort::nn {
namespace {

using namespace testing;  // tests/nn/sharded_checkpoint_fixture.h

// Holds the writer's thread in beforeWrite until release().
class Gate {
 public:
  std::function<void(const std::string&)> hook() {
    return [this](const std::string&) {
      entered_.set_value();
      released_.get_future().wait();
    };
  }
  void awaitEntered() { entered_.get_future().wait(); }
  void release() { released_.set_value(); }

 private:
  std::promise<void> entered_;
  std::promise<void> released_;
};

TEST(AsyncShardWriter, WritesWhatSubmitSawNotWhatChangedAfter) {
  TempDir dir;
  const std::string path = dir.file("run.st");
  const ShardMap map = testMap(3, 1);
  Gate gate;
  AsyncShardWriter writer(map, {.beforeWrite = gate.hook()});
  EXPECT_EQ(writer.stagingBytes(), 0u);
  std::vector<NamedTensor> shards = testShards(map, 1);
  writer.submit({.path = path, .generation = 1, .shards = shards});
  EXPECT_EQ(writer.stagingBytes(), testTensorNames().size() * map.shardNumel() * sizeof(float));
  gate.awaitEntered();  // the thread is about to write; the caller's next step changes everything
  for (NamedTensor& t : shards) t.tensor.fill(-1.0f);
  EXPECT_TRUE(writer.busy());
  gate.release();
  const std::optional<ShardFile> file = writer.wait();
  ASSERT_TRUE(file.has_value());
  EXPECT_EQ(file->path, shardFilePath(path, 1, 1, 3));
  EXPECT_FALSE(writer.wait().has_value());  // nothing submitted since
  const Checkpoint written = readCheckpoint(file->path);
  const std::vector<NamedTensor> want = testShards(map, 1);
  for (size_t t = 0; t < want.size(); ++t) {
    EXPECT_EQ(std::memcmp(written.tensors[t].tensor.data(), want[t].tensor.data(), want[t].tensor.bytes()), 0)
        << want[t].name;
  }
}

// submitStaged: the caller's stage function fills the staging (here only each shard's first
// element: the rest stays the zero it was allocated as), and the thread writes only after the
// write's ready function returns (here held until the test releases it, as a GPU copy's event
// would be); a ready that throws is the write's error.
TEST(AsyncShardWriter, AStagedWriteWaitsForItsReady) {
  TempDir dir;
  const std::string path = dir.file("run.st");
  const ShardMap map = testMap(3, 1);
  AsyncShardWriter writer(map);
  std::promise<void> copied;
  std::shared_future<void> landed = copied.get_future().share();
  std::vector<float*> given;
  writer.submitStaged({.path = path,
                       .generation = 1,
                       .names = testTensorNames(),
                       .stage =
                           [&](const std::vector<float*>& staging) {
                             given = staging;
                             for (size_t t = 0; t < staging.size(); ++t) staging[t][0] = 1.0f + static_cast<float>(t);
                           },
                       .ready = [landed] { landed.wait(); }});
  ASSERT_EQ(given.size(), testTensorNames().size());
  EXPECT_TRUE(writer.busy());  // waiting for ready: nothing written yet
  EXPECT_NE(::access(shardFilePath(path, 1, 1, 3).c_str(), F_OK), 0);
  copied.set_value();
  const std::optional<ShardFile> file = writer.wait();
  ASSERT_TRUE(file.has_value());
  const Checkpoint written = readCheckpoint(file->path);
  ASSERT_EQ(written.tensors.size(), testTensorNames().size());
  for (size_t t = 0; t < written.tensors.size(); ++t) {
    const runtime::Tensor& x = written.tensors[t].tensor;
    ASSERT_EQ(static_cast<size_t>(x.numel()), map.shardNumel());
    EXPECT_EQ(x.at(0), 1.0f + static_cast<float>(t));
    for (int64_t i = 1; i < x.numel(); ++i) ASSERT_EQ(x.at(i), 0.0f) << written.tensors[t].name << " " << i;
  }
  writer.submitStaged({.path = path,
                       .generation = 2,
                       .names = testTensorNames(),
                       .stage = [](const std::vector<float*>&) {},
                       .ready = [] { COHORT_THROW(TimeoutError) << "the copies' event did not complete"; }});
  expectThrowNaming<TimeoutError>([&] { writer.wait(); }, {"the copies' event did not complete"});
  expectThrowNaming<InvalidArgument>([&] { writer.submitStaged({.path = path, .generation = 3}); },
                                     {"stage function"});
}

TEST(AsyncShardWriter, ASecondSubmitWaitsForTheFirst) {
  TempDir dir;
  const std::string path = dir.file("run.st");
  const ShardMap map = testMap(1, 0);
  Gate gate;
  AsyncShardWriter writer(map, {.timeout = std::chrono::milliseconds(20), .beforeWrite = gate.hook()});
  writer.submit({.path = path, .generation = 1, .shards = testShards(map, 1)});
  gate.awaitEntered();
  // The first write cannot finish while the gate is shut, so the second must time out waiting for it.
  expectThrowNaming<TimeoutError>([&] { writer.submit({.path = path, .generation = 2, .shards = testShards(map, 2)}); },
                                  {shardFilePath(path, 1, 0, 1), "previous shard write has not finished"});
  expectThrowNaming<TimeoutError>([&] { writer.wait(); }, {shardFilePath(path, 1, 0, 1)});
  gate.release();
  ASSERT_TRUE(writer.wait().has_value());
  commitShardedCheckpoint(map, {.path = path, .generation = 1, .tensors = testTensorNames()});
  expectGeneration(readShardedCheckpoint(path), 1);
}

TEST(AsyncShardWriter, ABackgroundErrorSurfacesOnTheCallersThread) {
  TempDir dir;
  const std::string missing = dir.file("no/such/dir/run.st");
  const ShardMap map = testMap(2, 0);
  {
    AsyncShardWriter writer(map);
    writer.submit({.path = missing, .generation = 1, .shards = testShards(map, 1)});
    expectThrowNaming<IoError>([&] { writer.wait(); }, {shardFilePath(missing, 1, 0, 2)});
    EXPECT_FALSE(writer.wait().has_value());  // delivered once
    // Not waited for: the next submit delivers it instead of taking its own write.
    writer.submit({.path = missing, .generation = 2, .shards = testShards(map, 2)});
    expectThrowNaming<IoError>(
        [&] { writer.submit({.path = dir.file("run.st"), .generation = 3, .shards = testShards(map, 3)}); },
        {shardFilePath(missing, 2, 0, 2)});
    EXPECT_FALSE(writer.busy());
    writer.submit({.path = missing, .generation = 4, .shards = testShards(map, 4)});
  }  // the destructor waits for it, says its error on stderr and does not throw
  AsyncShardWriter writer(map);
  expectThrowNaming<InvalidArgument>(
      [&] { writer.submit({.path = missing, .generation = 1, .shards = {{"params", runtime::Tensor::zeros({3})}}}); },
      {"'params'", std::to_string(map.shardNumel())});
}

TEST(AsyncShardWriter, EveryRankThroughItsWriterMakesACheckpoint) {
  TempDir dir;
  const std::string path = dir.file("run.st");
  for (uint64_t generation : {1, 2}) {
    std::vector<ShardFile> files;
    for (int r = 0; r < 4; ++r) {
      AsyncShardWriter writer(testMap(4, r));
      writer.submit({.path = path, .generation = generation, .shards = testShards(testMap(4, r), generation)});
      files.push_back(*writer.wait());
    }
    commitShardedCheckpoint(testMap(4, 0),
                            {.path = path, .generation = generation, .tensors = testTensorNames(), .files = files});
    expectGeneration(readShardedCheckpoint(path), generation);
  }
}

}  // namespace
}  // namespace cohort::nn
