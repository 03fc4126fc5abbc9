// gtest wrappers over the public gradient check (nn/grad_check.h) for Cohort's own layer tests,
// and the helpers those tests share. Test-only.
//
// checkModuleGradients and checkLossGradient add one test failure, with the check's summary
// (where it is wrong, numeric and analytic values), when a gradient disagrees with finite
// differences.
#pragma once

#include <gtest/gtest.h>

#include "nn/grad_check.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "runtime/random.h"

namespace cohort::nn::testing {

using nn::GradCheckOptions;

// Checks d/d(input) and d/d(every parameter in `params`; an unbound buffer for a module without).
inline void checkModuleGradients(Module& m, ParamBuffer& params, const Tensor& x, const GradCheckOptions& o = {}) {
  GradCheckResult result = checkGradients(m, params, x, o);
  EXPECT_TRUE(result.ok) << m.name() << ": " << result.summary();
}

inline void checkLossGradient(Loss& loss, const Tensor& out, const Tensor& targets, const GradCheckOptions& o = {}) {
  GradCheckResult result = checkGradients(loss, out, targets, o);
  EXPECT_TRUE(result.ok) << loss.name() << ": " << result.summary();
}

// Registers m's parameters in `params` (prefix ""), allocates them and initialises them from `seed`.
inline void bindParams(Module& m, ParamBuffer& params, uint64_t seed) {
  m.registerParams(params, "");
  params.allocate(runtime::cpuAllocator());
  runtime::Rng rng(seed);
  m.resetParams(rng);
}

inline Tensor randomTensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::zeros(shape);
  runtime::Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.at(i) = rng.uniform(lo, hi);
  return t;
}

}  // namespace cohort::nn::testing
