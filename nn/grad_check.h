// Gradient checks: a module's or a loss's backward against finite differences of its forward, for
// users' own layers (call it from a test) as much as for Cohort's.
//
// Module: the scalar objective is L = Σ output ⊙ R with a fixed random R, so dL/d(output) = R and
// backward(R) must give dL/d(input) and dL/d(every registered parameter). Each element is compared
// with the central difference (L(θ+h) − L(θ−h)) / 2h, computed in double from float forwards; the
// error is |numeric − analytic| / max(1, |numeric|). The pass Rng is re-seeded before every forward,
// so stochastic layers (dropout) see the same mask each time. Beyond the values, the check
// catches a backward that adds to stale gradients instead of overwriting them (the gradient buffer
// holds a non-zero value before the backward) and, with checkAccumulate, one that ignores
// Pass::accumulateGrads (a second backward must double the gradients).
// Loss: L = loss.forward(output, targets), against loss.backward().
// Nothing is asserted or thrown for a wrong gradient: the result says where it is wrong, and
// summary() is a message for a test failure. InvalidArgument is thrown for what makes the check
// impossible: CUDA tensors (the check runs on the CPU), or registered parameters not yet bound.
// Side effects: the caller's input and output tensors are not modified (the check perturbs
// copies); parameter values are perturbed one at a time and restored exactly, and on return the
// gradient buffer holds the gradients of one backward. Costs two forwards per checked element:
// cap large tensors with maxPerTensor. Thread safety: as Module.
//
//   ParamBuffer params;
//   layer.registerParams(params, "scale.");
//   params.allocate(runtime::cpuAllocator());
//   GradCheckResult r = checkGradients(layer, params, x);
//   EXPECT_TRUE(r.ok) << r.summary();   // "... worst error 0.5 at scale.a[0] ..."
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/loss.h"
#include "nn/module.h"

namespace cohort::nn {

struct GradCheckOptions {
  float h = 1e-2f;              // finite-difference step
  double tolerance = 2e-3;      // on |numeric − analytic| / max(1, |numeric|)
  bool checkInput = true;       // compare d/d(input) too (modules)
  bool training = true;         // Pass::training of every forward (false: evaluation mode, e.g. BatchNorm)
  uint64_t seed = 5;            // of the pass Rng, re-seeded before every forward
  int64_t maxPerTensor = 0;     // elements checked per tensor, spread evenly over it; 0 = all
  bool checkAccumulate = true;  // modules: a second backward with Pass::accumulateGrads doubles the gradients
};

struct GradCheckResult {
  bool ok = true;
  double worstError = 0;              // the largest error seen
  std::string worstWhere = {};        // where: "fc.weight[3]", "input[5]", "output[2]" ("" when nothing was checked)
  int64_t checked = 0;                // elements compared
  int64_t failed = 0;                 // elements over the tolerance (and other failures, e.g. a missing input gradient)
  std::vector<std::string> failures = {};  // the first few, with numeric and analytic values

  // One line when ok ("gradient check passed: 42 elements, worst error 1.2e-05 at fc.weight[3]"),
  // else the count and the recorded failures.
  std::string summary() const;
};

// Checks `module`'s backward against finite differences at `input` (a CPU tensor). `params` is the
// ParamBuffer the module registered into, bound; a module without parameters passes an empty one.
GradCheckResult checkGradients(Module& module, ParamBuffer& params, const Tensor& input,
                               const GradCheckOptions& options = {});

// Checks loss.backward() against finite differences of loss.forward(output, targets) (CPU tensors).
GradCheckResult checkGradients(Loss& loss, const Tensor& output, const Tensor& targets,
                               const GradCheckOptions& options = {});

}  // namespace cohort::nn
