// Run under mpirun by node_averaging_test: every rank plays a node of one worker (its own leader)
// and drives train::NodeAveraging by hand, with exact data (small integers and halves), so the
// averaging rule's result is known to the bit whatever order MPI reduces in and whenever a round
// completes.
//
//   node_averaging_worker --scenario rule|uneven [--timeout-ms N]
// rule: prints "OK rank=R" when every copy ends as the rule says; uneven: rank 0 takes two steps
// (one round) and the others none, and every rank prints "MISMATCH rank=R <message>".
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "runtime/world_info.h"
#include "train/observe/timeline.h"
#include "train/placement/node_averaging.h"

namespace {

using cohort::train::NodeAveraging;

constexpr size_t kNumel = 37;  // not a multiple of anything MPI might split by

int check(const std::vector<float>& params, const std::vector<float>& want, const char* what, int rank) {
  size_t wrong = 0;
  for (size_t i = 0; i < want.size(); ++i) wrong += params[i] != want[i];
  if (wrong == 0) return 0;
  std::fprintf(stderr, "[rank %d] FAIL %s: %zu of %zu elements wrong (element 0: %g, want %g)\n", rank, what, wrong,
               want.size(), params[0], want[0]);
  return 1;
}

int run(const std::string& scenario, std::chrono::milliseconds timeout) {
  cohort::runtime::WorldInfo world = cohort::runtime::WorldInfo::detect();
  world.localRank = 0;  // every rank a node of its own
  world.localWorldSize = 1;
  const int r = world.rank;
  const auto n = static_cast<float>(world.worldSize);
  std::vector<float> params(kNumel);
  for (size_t i = 0; i < kNumel; ++i) params[i] = static_cast<float>(i);  // the first node's: broadcast
  if (r != 0) std::fill(params.begin(), params.end(), -1.0f);
  cohort::train::Timeline timeline;
  NodeAveraging averaging({.world = world,
                           .timeout = timeout,
                           .every = 2,
                           .params = params,
                           .nodeBarrier = [](const std::string&) {},
                           .timeline = &timeline});
  std::vector<float> want(kNumel);
  for (size_t i = 0; i < kNumel; ++i) want[i] = static_cast<float>(i);
  int failures = check(params, want, "the first node's parameters everywhere", r);
  if (scenario == "uneven") {
    if (r == 0) {
      averaging.afterStep();
      averaging.afterStep();
    }
    try {
      averaging.gather({});
      std::fprintf(stderr, "[rank %d] FAIL no error for uneven steps\n", r);
      return 1;
    } catch (const cohort::InvalidArgument& e) {
      std::printf("MISMATCH rank=%d %s\n", r, e.what());
      std::fflush(stdout);
      return 0;
    }
  }
  // Each of this node's updates adds r + 1 (a worker's step on the node's copy); the mean of the
  // nodes' updates is m = (n + 1) / 2.
  auto update = [&] {
    for (float& p : params) p += static_cast<float>(r + 1);
  };
  // Steps 1..4 with every = 2: round A starts at step 2 from a snapshot, round B at step 4 (after A
  // finished, at step 3's poll or waited for then); each is followed by an update made while it
  // runs. Whatever moment each round completes, keeping those updates (copy += average - snapshot)
  // and the full average give P0 + 4m everywhere; a rule that dropped them (copy = average) would not.
  for (int step = 1; step <= 4; ++step) {
    averaging.afterStep();
    update();
  }
  const double m = (n + 1) / 2;
  std::vector<double> mine = {static_cast<double>(r)};
  std::vector<double> all = averaging.gather(mine);
  for (int k = 0; k < world.worldSize; ++k) {
    if (all[static_cast<size_t>(k)] != k) {
      std::fprintf(stderr, "[rank %d] FAIL gather: row %d is %g\n", r, k, all[static_cast<size_t>(k)]);
      ++failures;
    }
  }
  for (size_t i = 0; i < kNumel; ++i) want[i] = static_cast<float>(static_cast<double>(i) + 4 * m);
  failures += check(params, want, "P0 + 4m after two rounds and the full average", r);
  if (averaging.rounds() != 2 || averaging.fullAverages() != 1) {
    std::fprintf(stderr, "[rank %d] FAIL %lld rounds and %lld full averages, want 2 and 1\n", r,
                 static_cast<long long>(averaging.rounds()), static_cast<long long>(averaging.fullAverages()));
    ++failures;
  }
  // A meeting with no step since: no averaging, nothing changes.
  averaging.gather({});
  failures += check(params, want, "unchanged by a meeting without steps", r);
  if (averaging.fullAverages() != 1) ++failures;
  if (failures == 0) std::printf("OK rank=%d\n", r);
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string scenario = "rule";
  std::chrono::milliseconds timeout{30000};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--scenario") == 0) scenario = argv[i + 1];
    if (std::strcmp(argv[i], "--timeout-ms") == 0) timeout = std::chrono::milliseconds(std::stoll(argv[i + 1]));
  }
  return cohort::runMain("node_averaging_worker: ", [&] { return run(scenario, timeout); });
}
