// Timeline (train/observe/timeline.h): inactive it records nothing; its ring keeps the newest spans and
// counts the dropped; totals add up per kind and reset when taken; Scope times its block.
#include "train/observe/timeline.h"

#include <gtest/gtest.h>

namespace cohort::train {
namespace {

TEST(Timeline, InactiveRecordsNothing) {
  Timeline t;
  EXPECT_FALSE(t.active());
  t.record(SpanKind::kForward, 0, 100);
  t.addAllReduce(1000, 10);
  t.addStep();
  { Timeline::Scope s(t, SpanKind::kBackward); }
  EXPECT_TRUE(t.spans().empty());
  Timeline::Totals totals = t.takeTotals();
  EXPECT_EQ(totals.ns[static_cast<size_t>(SpanKind::kForward)], 0);
  EXPECT_EQ(totals.steps, 0);
  EXPECT_EQ(totals.allReduceBytes, 0);
}

TEST(Timeline, TheRingKeepsTheNewestSpans) {
  Timeline t;
  t.start(4);
  for (int i = 0; i < 10; ++i) {
    t.setStep(i + 1);
    t.record(SpanKind::kAllReduce, 10 * i, 10 * i + 5, static_cast<uint16_t>(i));
  }
  std::vector<Span> spans = t.spans();
  ASSERT_EQ(spans.size(), 4u);
  EXPECT_EQ(t.dropped(), 6u);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(spans[k].aux, 6 + k);
    EXPECT_EQ(spans[k].step, 7 + k);
    EXPECT_EQ(spans[k].start, 10 * (6 + k));
    EXPECT_EQ(spans[k].end, 10 * (6 + k) + 5);
    EXPECT_EQ(spans[k].kind, SpanKind::kAllReduce);
  }
}

TEST(Timeline, TotalsAddUpPerKindAndResetWhenTaken) {
  Timeline t;
  t.start(0);  // the totals only
  EXPECT_TRUE(t.active());
  EXPECT_FALSE(t.tracing());
  t.record(SpanKind::kForward, 0, 30);
  t.record(SpanKind::kForward, 50, 70);
  t.record(SpanKind::kBarrier, 0, 7);
  t.addAllReduce(4096, 100);
  t.addStep();
  t.addStep();
  EXPECT_TRUE(t.spans().empty());
  Timeline::Totals a = t.takeTotals();
  EXPECT_EQ(a.ns[static_cast<size_t>(SpanKind::kForward)], 50);
  EXPECT_EQ(a.ns[static_cast<size_t>(SpanKind::kBarrier)], 7);
  EXPECT_EQ(a.ns[static_cast<size_t>(SpanKind::kBackward)], 0);
  EXPECT_EQ(a.steps, 2);
  EXPECT_EQ(a.allReduceBytes, 4096);
  EXPECT_EQ(a.allReduceNs, 100);
  Timeline::Totals b = t.takeTotals();
  EXPECT_EQ(b.ns[static_cast<size_t>(SpanKind::kForward)], 0);
  EXPECT_EQ(b.steps, 0);
}

TEST(Timeline, AScopeTimesItsBlockOnTheMonotonicClock) {
  Timeline t;
  t.start(8);
  const int64_t before = t.now();
  { Timeline::Scope s(t, SpanKind::kOptimizer); }
  const int64_t after = t.now();
  ASSERT_EQ(t.spans().size(), 1u);
  const Span s = t.spans()[0];
  EXPECT_EQ(s.kind, SpanKind::kOptimizer);
  EXPECT_GE(s.start, before);
  EXPECT_LE(s.end, after);
  EXPECT_LE(s.start, s.end);
  EXPECT_STREQ(toString(SpanKind::kCommWait), "comm_wait");
}

}  // namespace
}  // namespace cohort::train
