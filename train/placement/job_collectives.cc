#include "train/placement/job_collectives.h"

#include <algorithm>
#include <cstring>

namespace cohort::train {

void JobCollectives::reduce(std::span<double> values, ScalarOp op) {
  int ranks = 1;
  const std::vector<double> all = gatherRows(values, ranks);
  reduceRows(values, all, ranks, op);
}

void reduceRows(std::span<double> values, std::span<const double> all, int ranks, ScalarOp op) {
  const size_t n = values.size();
  for (size_t i = 0; i < n; ++i) {
    double acc = all[i];
    for (int r = 1; r < ranks; ++r) {
      const double v = all[static_cast<size_t>(r) * n + i];
      acc = op == ScalarOp::kMax ? std::max(acc, v) : acc + v;
    }
    values[i] = op == ScalarOp::kMean ? acc / ranks : acc;
  }
}

std::vector<double> gatherDoubles(collectives::Communicator& comm, std::span<const double> mine,
                                  std::chrono::milliseconds timeout) {
  static_assert(sizeof(double) == 2 * sizeof(float));
  std::vector<double> all(static_cast<size_t>(comm.size()) * mine.size());
  if (mine.empty()) return all;
  if (comm.backend() == "nccl") {
    // NCCL moves host memory only in small staged all-reduces and broadcasts: each rank's values go
    // out in turn, kBroadcastDoubles at a time, as raw bits (a broadcast copies, it never adds).
    constexpr size_t kBroadcastDoubles = 16;
    for (int r = 0; r < comm.size(); ++r) {
      double* row = all.data() + static_cast<size_t>(r) * mine.size();
      if (r == comm.rank()) std::copy(mine.begin(), mine.end(), row);
      for (size_t first = 0; first < mine.size(); first += kBroadcastDoubles) {
        const size_t n = std::min(kBroadcastDoubles, mine.size() - first);
        comm.broadcast(reinterpret_cast<float*>(row + first), 2 * n, r)->wait(timeout);
      }
    }
    return all;
  }
  std::vector<float> sent(2 * mine.size()), received(2 * all.size());
  std::memcpy(sent.data(), mine.data(), mine.size_bytes());
  comm.allGather(sent.data(), received.data(), sent.size(), {})->wait(timeout);
  std::memcpy(all.data(), received.data(), all.size() * sizeof(double));
  return all;
}

std::vector<double> LocalCollectives::gatherRows(std::span<const double> mine, int& ranks) {
  ranks = 1;
  return {mine.begin(), mine.end()};
}

void CommCollectives::barrier(const std::string&) {
  Timeline::Scope span(timeline_, SpanKind::kBarrier);
  comm_.barrier()->wait(timeout_);
}

std::vector<double> CommCollectives::gatherRows(std::span<const double> mine, int& ranks) {
  ranks = comm_.size();
  return gatherDoubles(comm_, mine, timeout_);
}

}  // namespace cohort::train
