// Helpers for tests that need a CUDA device (tags = ["gpu"]).
//
// COHORT_SKIP_WITHOUT_CUDA_DEVICE() at the top of a test body (or in a fixture's SetUp) skips the
// test visibly, with "no CUDA device: <reason>" in the test log, when CUDA is not compiled in or no
// device is usable (no driver, no GPU). Test targets depend on //tests/runtime/cuda:gpu_test_util.
// Thread safety: call from the test's main thread.
//
//   TEST(MyKernel, MatchesCpu) {
//     COHORT_SKIP_WITHOUT_CUDA_DEVICE();
//     ...
//   }
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "runtime/device_query.h"

namespace cohort::testing {

// "" when at least one CUDA device is usable; otherwise why not ("CUDA support not compiled in",
// "CUDA driver not found or too old: ...").
inline std::string whyNoCudaDevice() {
  std::string why;
  if (!runtime::cudaDevices(&why).empty()) return "";
  // cudaDevices says "no CUDA device (<reason>)"; the skip message adds that prefix itself.
  const std::string wrapper = "no CUDA device (";
  if (why.rfind(wrapper, 0) == 0 && why.back() == ')') {
    why = why.substr(wrapper.size(), why.size() - wrapper.size() - 1);
  }
  return why.empty() ? "unknown reason" : why;
}

}  // namespace cohort::testing

#define COHORT_SKIP_WITHOUT_CUDA_DEVICE()                                   \
  do {                                                                      \
    std::string cohort_why_no_cuda_ = ::cohort::testing::whyNoCudaDevice(); \
    if (!cohort_why_no_cuda_.empty()) {                                     \
      GTEST_SKIP() << "no CUDA device: " << cohort_why_no_cuda_;            \
    }                                                                       \
  } while (0)
