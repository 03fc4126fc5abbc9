// Helpers for the train/ tests: ranks of one job as forked processes of the test (each with its own
// WorldInfo, a fresh job id; the caller provides a fresh COHORT_SHM_DIR), and a small learnable
// dataset. Children report failures through their exit code (tests/ipc/multiproc.h).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "runtime/data/dataset.h"
#include "runtime/random.h"
#include "runtime/world_info.h"
#include "tests/ipc/multiproc.h"

namespace cohort::train::testing {

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
