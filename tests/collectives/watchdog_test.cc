// CollectiveWatchdog's state machine without a GPU: collectives are fake probes the test finishes,
// fails or leaves stuck, and the backend's abort and asynchronous error are injected hooks.
#include "collectives/watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "runtime/error.h"

namespace cohort::collectives {
namespace {

using namespace std::chrono_literals;
using State = CollectiveWatchdog::State;

Fingerprint allReduce(uint64_t sequence, uint64_t count) {
  return {.sequence = sequence, .kind = CollectiveKind::kAllReduce, .op = ReduceOp::kSum, .count = count};
}

// A fake collective: pending until the test sets it done or failed.
struct FakeOp {
  std::atomic<int> state{0};  // 0 pending, 1 done, 2 failed
  CollectiveWatchdog::ProbeFn probe() {
    return [this] {
      int s = state.load();
      return s == 1   ? CollectiveWatchdog::Probe{State::kDone, ""}
             : s == 2 ? CollectiveWatchdog::Probe{State::kFailed, "unhandled cuda error"}
                      : CollectiveWatchdog::Probe{State::kPending, ""};
    };
  }
};

struct Harness {
  std::atomic<int> aborts{0};
  std::atomic<bool> asyncFailure{false};
  std::unique_ptr<CollectiveWatchdog> make(std::chrono::milliseconds timeout) {
    return std::make_unique<CollectiveWatchdog>(
        CollectiveWatchdog::Hooks{
            .asyncError = [this] { return asyncFailure ? std::string("remote process exited") : ""; },
            .abort = [this] { ++aborts; }},
        CollectiveWatchdog::Options{.timeout = timeout, .pollInterval = 5ms, .rank = 3, .backend = "nccl"});
  }
};

// Polls (bounded) until `cond` holds.
template <class F>
bool eventually(F cond, std::chrono::milliseconds limit = 5s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

// Waits (bounded) until the watchdog has failed.
bool waitFailed(const CollectiveWatchdog& w, std::chrono::milliseconds limit = 5s) {
  return eventually([&] { return w.failed(); }, limit);
}

// The watchdog records its error before it calls the abort hook, so failed() may be seen first:
// wait (bounded) for the abort, then destroy the watchdog, which joins its thread (no hook runs after
// the destructor returns), and check that it was the only one.
void expectAbortedOnce(Harness& h, std::unique_ptr<CollectiveWatchdog>& w) {
  EXPECT_TRUE(eventually([&] { return h.aborts.load() >= 1; })) << "the abort hook was not called";
  w.reset();
  EXPECT_EQ(h.aborts.load(), 1);
}

template <class E>
std::string messageOf(const CollectiveWatchdog& w) {
  try {
    w.rethrowIfFailed();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no error";
}

TEST(CollectiveWatchdog, FinishedCollectivesAreDroppedAndNothingFails) {
  Harness h;
  FakeOp a, b;  // (declared before the watchdog, whose thread probes them, so they outlive it)
  auto w = h.make(200ms);
  w->track(allReduce(0, 10), a.probe());
  w->track(allReduce(1, 10), b.probe());
  EXPECT_EQ(w->pending(), 2u);
  b.state = 1;  // out of order is fine
  a.state = 1;
  EXPECT_TRUE(eventually([&] { return w->pending() == 0; }));
  std::this_thread::sleep_for(300ms);  // past the timeout: nothing is left to time out
  EXPECT_FALSE(w->failed());
  EXPECT_EQ(h.aborts, 0);
  EXPECT_NO_THROW(w->rethrowIfFailed());
}

TEST(CollectiveWatchdog, AStuckCollectiveTimesOutAbortsOnceAndNamesItself) {
  Harness h;
  FakeOp done, stuck, later;
  auto w = h.make(150ms);
  w->track(allReduce(6, 5), done.probe());
  done.state = 1;
  const auto issued = std::chrono::steady_clock::now();
  w->track(allReduce(7, 1000), stuck.probe());
  ASSERT_TRUE(waitFailed(*w));
  const auto took = std::chrono::steady_clock::now() - issued;
  EXPECT_GE(took, 150ms) << "failed before the timeout";
  EXPECT_LT(took, 3s);
  const std::string msg = messageOf<TimeoutError>(*w);
  EXPECT_NE(msg.find("#7 allreduce(sum, float32, 1000 elements)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("within 0.15 s"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("aborted"), std::string::npos) << msg;
  EXPECT_EQ(w->pending(), 0u);
  // Terminal: the next collective is refused with the same error, and nothing more is aborted.
  EXPECT_THROW(w->track(allReduce(8, 1), later.probe()), TimeoutError);
  expectAbortedOnce(h, w);
}

TEST(CollectiveWatchdog, AFailedCollectiveIsAPeerError) {
  Harness h;
  FakeOp op;
  auto w = h.make(10s);
  w->track(allReduce(2, 64), op.probe());
  op.state = 2;
  ASSERT_TRUE(waitFailed(*w, 2s)) << "an error must not wait for the timeout";
  const std::string msg = messageOf<PeerError>(*w);
  EXPECT_NE(msg.find("#2 allreduce"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unhandled cuda error"), std::string::npos) << msg;
  expectAbortedOnce(h, w);
}

TEST(CollectiveWatchdog, TheBackendsAsyncErrorFailsItWithItsMessage) {
  Harness h;
  FakeOp op;
  auto w = h.make(10s);
  w->track(allReduce(4, 8), op.probe());
  h.asyncFailure = true;
  ASSERT_TRUE(waitFailed(*w, 2s));
  const std::string msg = messageOf<PeerError>(*w);
  EXPECT_NE(msg.find("remote process exited"), std::string::npos) << msg;
  EXPECT_NE(msg.find("during #4 allreduce"), std::string::npos) << msg;
  expectAbortedOnce(h, w);
}

TEST(CollectiveWatchdog, AnIdleWatchdogNeverTimesOut) {
  Harness h;
  auto w = h.make(20ms);
  std::this_thread::sleep_for(150ms);
  EXPECT_FALSE(w->failed());
  EXPECT_EQ(h.aborts, 0);
}

TEST(CollectiveWatchdog, DestroyingItWithPendingWorkDoesNotAbort) {
  Harness h;
  FakeOp op;
  {
    auto w = h.make(10s);
    w->track(allReduce(0, 1), op.probe());
  }
  EXPECT_EQ(h.aborts, 0);
}

}  // namespace
}  // namespace cohort::collectives
