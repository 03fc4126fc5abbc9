// WorkPool and WorkQueue (collectives/work_pool.h): a Work goes back to its pool when its last owner
// lets go and is handed out again; a queue is an owner; Works in use when the pool goes are freed
// by their last owner; WorkPtr still takes a user's own Work. And the shm backend's rule that a
// Work may be destroyed, but not waited for, after its communicator.
#include "collectives/work_pool.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/shm/shm_communicator.h"
#include "runtime/world_info.h"

namespace cohort::collectives {
namespace {

// Counts its constructions and destructions in the test's own counters.
struct Counts {
  int made = 0;
  int freed = 0;
};

class FakeWork : public PooledWork {
 public:
  explicit FakeWork(Counts& counts) : counts_(counts) { ++counts_.made; }
  ~FakeWork() override { ++counts_.freed; }
  bool done() override { return true; }
  void wait(std::chrono::milliseconds) override {}
  bool poolGone() const { return orphaned(); }
  int id = 0;  // what a test wrote, to tell objects apart

 private:
  Counts& counts_;
};

TEST(WorkPool, HandsOutAnObjectAgainOnceItsOwnerLetGo) {
  Counts counts;
  WorkPool<FakeWork> pool;
  PooledPtr<FakeWork> a = pool.acquire(counts);
  PooledPtr<FakeWork> b = pool.acquire(counts);
  EXPECT_NE(a.get(), b.get());
  FakeWork* first = a.get();
  a.reset();
  PooledPtr<FakeWork> c = pool.acquire(counts);
  EXPECT_EQ(c.get(), first);
  EXPECT_EQ(counts.made, 2);
  WorkPtr asWork = std::move(c);  // a pooled Work is a WorkPtr like any other
  asWork.reset();
  EXPECT_EQ(pool.acquire(counts).get(), first);
  EXPECT_EQ(counts.made, 2);
  EXPECT_EQ(counts.freed, 0);
}

TEST(WorkQueue, OwnsWhatItHoldsAndKeepsTheOrder) {
  Counts counts;
  WorkPool<FakeWork> pool;
  WorkQueue<FakeWork> queue;
  EXPECT_TRUE(queue.empty());
  std::vector<FakeWork*> pushed;
  for (int i = 0; i < 3; ++i) {
    PooledPtr<FakeWork> work = pool.acquire(counts);
    work->id = i;
    queue.push(*work);
    pushed.push_back(work.get());
  }  // each caller's WorkPtr is gone, the queue still owns the three
  PooledPtr<FakeWork> other = pool.acquire(counts);
  EXPECT_EQ(counts.made, 4);
  for (int i = 0; i < 3; ++i) {
    ASSERT_FALSE(queue.empty());
    PooledPtr<FakeWork> work = queue.pop();
    EXPECT_EQ(work.get(), pushed[i]);
    EXPECT_EQ(work->id, i);
  }
  EXPECT_TRUE(queue.empty());
  for (int i = 0; i < 3; ++i) pool.acquire(counts);  // each back on the shelf, then taken again
  EXPECT_EQ(counts.made, 4);
}

TEST(WorkPool, WorksInUseWhenItGoesAreFreedByTheirLastOwner) {
  Counts counts;
  auto pool = std::make_unique<WorkPool<FakeWork>>();
  PooledPtr<FakeWork> inUse = pool->acquire(counts);
  PooledPtr<FakeWork> queued = pool->acquire(counts);
  auto queue = std::make_unique<WorkQueue<FakeWork>>();
  queue->push(*queued);
  queued.reset();
  pool->acquire(counts).reset();  // a third, idle
  EXPECT_FALSE(inUse->poolGone());
  pool.reset();
  EXPECT_EQ(counts.freed, 1);  // the idle one
  EXPECT_TRUE(inUse->poolGone());
  inUse.reset();
  EXPECT_EQ(counts.freed, 2);
  queue.reset();
  EXPECT_EQ(counts.freed, 3);
  EXPECT_EQ(counts.made, 3);
}

// A Communicator of one's own may still return std::make_unique'd Works (docs/api.md).
TEST(WorkPtr, TakesAndDeletesAPlainWork) {
  struct PlainWork : Work {
    explicit PlainWork(bool& deleted) : deleted(deleted) {}
    ~PlainWork() override { deleted = true; }
    bool done() override { return true; }
    void wait(std::chrono::milliseconds) override {}
    bool& deleted;
  };
  bool deleted = false;
  WorkPtr work = std::make_unique<PlainWork>(deleted);
  work.reset();
  EXPECT_TRUE(deleted);
}

std::unique_ptr<Communicator> oneRankShm() {
  return makeShmCommunicator({.backend = "shm", .world = runtime::WorldInfo{}, .timeout = std::chrono::seconds(5)});
}

TEST(ShmWork, MayBeDestroyedAfterItsCommunicator) {
  auto comm = oneRankShm();
  float value = 1;
  WorkPtr done = comm->allReduce(&value, &value, 1, {});
  done->wait(std::chrono::seconds(5));
  WorkPtr neverWaited = comm->barrier();
  comm.reset();  // runs the barrier first
  neverWaited.reset();
  done.reset();
}

TEST(ShmWorkDeathTest, WaitAfterItsCommunicatorIsACheckFailure) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto comm = oneRankShm();
        float value = 1;
        WorkPtr work = comm->allReduce(&value, &value, 1, {});
        comm.reset();
        work->wait(std::chrono::seconds(5));
      },
      "used after its communicator was destroyed");
}

}  // namespace
}  // namespace cohort::collectives
