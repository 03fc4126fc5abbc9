#include "train/observe/step_times.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace cohort::train {

namespace {

// One rank's row of the gather: per-step milliseconds and the all-reduce's rate.
enum Column { kSteps, kStepMs, kForward, kBackward, kOptimizer, kComm, kBarrier, kData, kBusbw, kColumns };

double ms(int64_t ns, int64_t steps) { return steps > 0 ? static_cast<double>(ns) / 1e6 / static_cast<double>(steps) : 0; }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

StepTimes gatherStepTimes(Job& job, const Timeline::Totals& totals, double epochSeconds) {
  const int world = job.world().worldSize, rank = job.world().rank;
  const int64_t steps = totals.steps;
  auto ns = [&](SpanKind k) { return totals.ns[static_cast<size_t>(k)]; };
  std::vector<double> all(static_cast<size_t>(world) * kColumns, 0.0);
  double* mine = all.data() + static_cast<size_t>(rank) * kColumns;
  mine[kSteps] = static_cast<double>(steps);
  mine[kStepMs] = steps > 0 ? epochSeconds * 1e3 / static_cast<double>(steps) : 0;
  mine[kForward] = ms(ns(SpanKind::kForward), steps);
  mine[kBackward] = ms(ns(SpanKind::kBackward), steps);
  mine[kOptimizer] = ms(ns(SpanKind::kOptimizer), steps);
  mine[kComm] = ms(ns(SpanKind::kCommWait) + ns(SpanKind::kReduce), steps);
  mine[kBarrier] = ms(ns(SpanKind::kBarrier), steps);
  mine[kData] = ms(ns(SpanKind::kData), steps);
  const double n = static_cast<double>(world);
  mine[kBusbw] = totals.allReduceNs > 0 ? totals.allReduceBytes * 2 * (n - 1) / n / static_cast<double>(totals.allReduceNs) : 0;
  if (world > 1) job.reduce(all, Reduce::kSum);

  StepTimes t;
  t.steps = static_cast<int64_t>(all[kSteps]);
  double busbwSum = 0;
  int busbwRanks = 0;
  for (int r = 0; r < world; ++r) {
    const double* row = all.data() + static_cast<size_t>(r) * kColumns;
    t.stepMs += row[kStepMs] / n;
    t.forwardMs += row[kForward] / n;
    t.backwardMs += row[kBackward] / n;
    t.optimizerMs += row[kOptimizer] / n;
    t.commMs += row[kComm] / n;
    t.barrierMs += row[kBarrier] / n;
    t.dataMs += row[kData] / n;
    if (row[kBusbw] > 0) {
      busbwSum += row[kBusbw];
      ++busbwRanks;
    }
    t.rankBusyMs.push_back(row[kForward] + row[kBackward] + row[kOptimizer] + row[kData]);
    t.rankBarrierMs.push_back(row[kBarrier]);
  }
  t.computeMs = t.forwardMs + t.backwardMs + t.optimizerMs;
  t.busbwGBps = busbwRanks ? busbwSum / busbwRanks : 0;  // bytes per ns is GB/s
  t.slowestRank = static_cast<int>(std::max_element(t.rankBusyMs.begin(), t.rankBusyMs.end()) - t.rankBusyMs.begin());
  const double mid = median(t.rankBusyMs);
  t.slowestMargin = mid > 0 ? t.rankBusyMs[static_cast<size_t>(t.slowestRank)] / mid - 1 : 0;
  for (int r = 0; r < world; ++r) {
    if (r != t.slowestRank) t.othersBarrierMs += t.rankBarrierMs[static_cast<size_t>(r)] / (n - 1);
  }
  return t;
}

std::string describe(const StepTimes& t, int worldSize) {
  char buf[512];
  std::ostringstream out;
  std::snprintf(buf, sizeof buf,
                "time per step %.3f ms: compute %.3f (forward %.3f, backward %.3f, optimizer %.3f), communication "
                "%.3f, barrier wait %.3f, data wait %.3f",
                t.stepMs, t.computeMs, t.forwardMs, t.backwardMs, t.optimizerMs, t.commMs, t.barrierMs, t.dataMs);
  out << buf;
  if (t.busbwGBps > 0) {
    std::snprintf(buf, sizeof buf, "; all-reduce busbw %.2f GB/s", t.busbwGBps);
    out << buf;
  }
  if (worldSize > 1) {
    std::snprintf(buf, sizeof buf, "; slowest rank %d: %.0f%% slower than the median (the others wait %.3f ms/step at barriers)",
                  t.slowestRank, t.slowestMargin * 100, t.othersBarrierMs);
    out << buf;
  }
  return out.str();
}

std::vector<std::pair<std::string, double>> metricsOf(const StepTimes& t) {
  return {{"step_ms", t.stepMs},           {"compute_ms", t.computeMs},      {"forward_ms", t.forwardMs},
          {"backward_ms", t.backwardMs},   {"optimizer_ms", t.optimizerMs},  {"comm_ms", t.commMs},
          {"barrier_ms", t.barrierMs},     {"data_ms", t.dataMs},            {"busbw_gbps", t.busbwGBps},
          {"slowest_rank", t.slowestRank}, {"slowest_margin", t.slowestMargin},
          {"others_barrier_ms", t.othersBarrierMs}};
}

}  // namespace cohort::train
