// Helpers for the train/ tests: ranks of one job as forked processes of the test (each with its own
// WorldInfo, a fresh job id; the caller provides a fresh COHORT_SHM_DIR), and a small learnable
// dataset. Children report failures through their exit code (tests/ipc/multiproc.h).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/data/dataset.h"
#include "runtime/random.h"
#include "runtime/world_info.h"
#include "tests/ipc/multiproc.h"

namespace cohort::train::testing {

// Token ids below `vocab` for rank `rank`'s micro-batch `micro` of step `step`, 18 of them (a
// [2, 9] window: a context of 8 and its next-token targets), different for every rank, step and
// micro-batch, the same in every process that asks.
inline std::vector<float> tokenWindow(int rank, int step, int micro, int vocab) {
  std::vector<float> ids(18);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<float>(
        (static_cast<int>(i) * 7 + rank * 11 + step * 5 + micro * 3 + (step * step) % 13) % vocab);
  }
  return ids;
}

// Runs `body` on `ranks` forked processes of one fresh job on this node; expects each to exit 0.
inline void runRanks(int ranks, const std::function<int(const runtime::WorldInfo&)>& body) {
  const std::string jobId = ipc::testing::freshJobId();
  std::vector<pid_t> children;
  for (int r = 0; r < ranks; ++r) {
    runtime::WorldInfo world{.rank = r, .worldSize = ranks, .localRank = r, .localWorldSize = ranks, .jobId = jobId,
                             .source = ranks > 1 ? "test" : "single"};
    children.push_back(ipc::testing::forkChild([=] { return body(world); }));
  }
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(ipc::testing::waitChild(children[static_cast<size_t>(r)], std::chrono::seconds(120)), 0) << "rank " << r;
  }
}

// What one rank of runRanksCapturing printed on stdout (the job's log) and the message of what it
// threw (empty when nothing).
struct RankOutput {
  std::string log, error;
};

// runRanks with each rank's stdout in STEM.rank<R>.log and what `body` throws written to
// STEM.rank<R>.error (the rank then exits 0); returns every rank's, read after all have exited.
inline std::vector<RankOutput> runRanksCapturing(const std::string& stem, int ranks,
                                                 const std::function<void(const runtime::WorldInfo&)>& body) {
  runRanks(ranks, [&](const runtime::WorldInfo& world) {
    const std::string mine = stem + ".rank" + std::to_string(world.rank);
    const int fd = ::open((mine + ".log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::dup2(fd, 1) < 0) return 90;
    try {
      body(world);
    } catch (const std::exception& e) {
      std::ofstream(mine + ".error") << e.what();
    }
    return 0;
  });
  auto read = [](const std::string& path) {
    std::stringstream s;
    s << std::ifstream(path).rdbuf();
    return s.str();
  };
  std::vector<RankOutput> out;
  for (int r = 0; r < ranks; ++r) {
    const std::string mine = stem + ".rank" + std::to_string(r);
    out.push_back({read(mine + ".log"), read(mine + ".error")});
  }
  return out;
}

// `n` samples of 20 features in [-1, 1) with 3 classes from a fixed linear teacher.
inline std::unique_ptr<runtime::data::Dataset> teacherData(int64_t n = 384, uint64_t seed = 11) {
  runtime::data::DatasetContents c;
  c.name = "teacher";
  c.inputs = runtime::Tensor::zeros(runtime::Shape{n, 20});
  c.targets = runtime::Tensor::zeros(runtime::Shape{n});
  c.numClasses = 3;
  runtime::Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    double score[3] = {0, 0, 0};
    for (int64_t j = 0; j < 20; ++j) {
      const float x = rng.uniform(-1.0f, 1.0f);
      c.inputs.at(i * 20 + j) = x;
      for (int k = 0; k < 3; ++k) score[k] += x * std::sin(1.0 + static_cast<double>(j) * 0.7 + k * 2.1);
    }
    c.targets.at(i) = static_cast<float>(std::max_element(score, score + 3) - score);
  }
  return std::make_unique<runtime::data::Dataset>(std::move(c));
}

}  // namespace cohort::train::testing
