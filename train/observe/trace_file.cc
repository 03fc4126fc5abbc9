#include "train/observe/trace_file.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/checkpoint.h"  // writeFileAtomically
#include "runtime/error.h"

namespace cohort::train {

namespace {

// A non-negative 63-bit integer as three 21-bit digits: exact through any backend's reduction
// (float32 holds integers below 2^24).
constexpr int kDigits = 3;
constexpr int64_t kDigitBase = int64_t{1} << 21;

void putInt(std::vector<double>& row, size_t& at, int64_t v) {
  COHORT_CHECK(v >= 0) << "trace values are non-negative, got " << v;
  for (int d = 0; d < kDigits; ++d, v /= kDigitBase) row[at++] = static_cast<double>(v % kDigitBase);
}

int64_t getInt(const double* row, size_t& at) {
  int64_t v = 0, scale = 1;
  for (int d = 0; d < kDigits; ++d, scale *= kDigitBase) v += static_cast<int64_t>(row[at++]) * scale;
  return v;
}

// A rank's row: origin, dropped, span count, the clock rounds (received, replied), then the spans
// (kind, aux, step, start, end).
constexpr size_t kHeaderInts = 3 + 2 * kClockRounds;
constexpr size_t kSpanValues = 2 + 3 * kDigits;

struct RankTrace {
  int64_t origin = 0;
  int64_t dropped = 0;
  std::vector<Timeline::ClockRound> rounds;
  std::vector<Span> spans;
};

// Rank r's clock ahead of rank 0's (ns) and the bound, from the narrowest round.
std::pair<double, double> clockOffset(const RankTrace& zero, const RankTrace& r) {
  double best = 0, bound = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < r.rounds.size() && i < zero.rounds.size(); ++i) {
    const double a = static_cast<double>(zero.rounds[i].sent + zero.origin);
    const double d = static_cast<double>(zero.rounds[i].back + zero.origin);
    const double b = static_cast<double>(r.rounds[i].received + r.origin);
    const double c = static_cast<double>(r.rounds[i].replied + r.origin);
    const double high = b - a, low = c - d;
    if ((high - low) / 2 < bound) {
      bound = (high - low) / 2;
      best = (high + low) / 2;
    }
  }
  return {best, bound};
}

void writeJson(const nlohmann::json& trace, const std::string& path) {
  const std::string text = trace.dump() + "\n";
  nn::writeFileAtomically(path, {std::as_bytes(std::span(text))});
}

nlohmann::json mergedTrace(const std::vector<RankTrace>& ranks) {
  nlohmann::json events = nlohmann::json::array();
  nlohmann::json offsets = nlohmann::json::array(), bounds = nlohmann::json::array(),
                 dropped = nlohmann::json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const auto [theta, bound] = r == 0 ? std::pair<double, double>{0, 0} : clockOffset(ranks[0], ranks[r]);
    offsets.push_back(theta / 1e3);
    bounds.push_back(bound / 1e3);
    dropped.push_back(ranks[r].dropped);
    const int pid = static_cast<int>(r);
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", "rank " + std::to_string(r)}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", "training"}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 1}, {"args", {{"name", "all-reduce"}}}});
    // This rank's time t (ns since its origin) on rank 0's: t + origin_r - theta - origin_0.
    const double shift = static_cast<double>(ranks[r].origin - ranks[0].origin) - theta;
    for (const Span& s : ranks[r].spans) {
      const bool bucket = s.kind == SpanKind::kAllReduce;
      nlohmann::json e = {{"name", bucket ? "allreduce bucket " + std::to_string(s.aux) : toString(s.kind)},
                          {"cat", toString(s.kind)},
                          {"ph", "X"},
                          {"ts", (static_cast<double>(s.start) + shift) / 1e3},
                          {"dur", static_cast<double>(s.end - s.start) / 1e3},
                          {"pid", pid},
                          {"tid", bucket ? 1 : 0},
                          {"args", {{"step", s.step}}}};
      if (bucket) e["args"]["bucket"] = s.aux;
      events.push_back(std::move(e));
    }
  }
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"clock", "rank 0's CLOCK_MONOTONIC since its trace started, microseconds"},
            {"clock_offset_us", std::move(offsets)},
            {"clock_error_bound_us", std::move(bounds)},
            {"dropped_spans", std::move(dropped)}}}};
}

}  // namespace

void measureClocks(Job& job, Timeline& timeline) {
  auto& rounds = timeline.clockRounds();
  rounds.clear();
  if (job.world().isSingle()) return;
  for (int i = 0; i < kClockRounds; ++i) {
    Timeline::ClockRound round;
    double v = 0;
    round.sent = timeline.now();
    job.reduce({&v, 1}, Reduce::kSum);
    round.received = timeline.now();
    round.replied = timeline.now();
    job.reduce({&v, 1}, Reduce::kSum);
    round.back = timeline.now();
    rounds.push_back(round);
  }
}

void writeTrace(Job& job, const Timeline& timeline, const std::string& path, int64_t testSkewNs) {
  const int world = job.world().worldSize, rank = job.world().rank;
  const std::vector<Span> spans = timeline.spans();
  double most = static_cast<double>(spans.size());
  job.reduce({&most, 1}, Reduce::kMax);
  const size_t rowSize = kHeaderInts * kDigits + static_cast<size_t>(most) * kSpanValues;
  std::vector<double> all(rowSize * static_cast<size_t>(world), 0.0);
  {
    std::vector<double> row(rowSize, 0.0);
    size_t at = 0;
    putInt(row, at, timeline.originClockNs() + testSkewNs);
    putInt(row, at, static_cast<int64_t>(timeline.dropped()));
    putInt(row, at, static_cast<int64_t>(spans.size()));
    const auto& rounds = timeline.clockRounds();
    for (int i = 0; i < kClockRounds; ++i) {
      const bool have = static_cast<size_t>(i) < rounds.size();
      // Rank 0 sends its own ends of the rounds (sent, back); the others theirs (received, replied).
      putInt(row, at, have ? (rank == 0 ? rounds[i].sent : rounds[i].received) : 0);
      putInt(row, at, have ? (rank == 0 ? rounds[i].back : rounds[i].replied) : 0);
    }
    for (const Span& s : spans) {
      row[at++] = static_cast<double>(s.kind);
      row[at++] = s.aux;
      putInt(row, at, s.step);
      putInt(row, at, s.start);
      putInt(row, at, s.end);
    }
    std::copy(row.begin(), row.end(), all.begin() + static_cast<ptrdiff_t>(rowSize * static_cast<size_t>(rank)));
  }
  if (world > 1) job.reduce(all, Reduce::kSum);
  if (rank != 0) return;
  std::vector<RankTrace> ranks(static_cast<size_t>(world));
  const bool measured = !timeline.clockRounds().empty();
  for (int r = 0; r < world; ++r) {
    const double* row = all.data() + rowSize * static_cast<size_t>(r);
    RankTrace& t = ranks[static_cast<size_t>(r)];
    size_t at = 0;
    t.origin = getInt(row, at);
    t.dropped = getInt(row, at);
    const int64_t count = getInt(row, at);
    for (int i = 0; i < kClockRounds; ++i) {
      const int64_t first = getInt(row, at), second = getInt(row, at);
      if (!measured) continue;
      t.rounds.push_back(r == 0 ? Timeline::ClockRound{.sent = first, .back = second}
                                : Timeline::ClockRound{.received = first, .replied = second});
    }
    for (int64_t i = 0; i < count; ++i) {
      Span s;
      s.kind = static_cast<SpanKind>(static_cast<int>(row[at++]));
      s.aux = static_cast<uint16_t>(row[at++]);
      s.step = static_cast<int32_t>(getInt(row, at));
      s.start = getInt(row, at);
      s.end = getInt(row, at);
      t.spans.push_back(s);
    }
  }
  writeJson(mergedTrace(ranks), path);
}

}  // namespace cohort::train
