// Finite-difference gradient checks for modules and losses (tests only).
//
// For a module, the scalar objective is L = Σ output ⊙ R with a fixed random R, so dL/d(output) = R
// and backward(R) must give dL/d(input) and dL/d(params). Each is compared against the central
// difference (L(θ+h) − L(θ−h)) / 2h computed in double from float forwards.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "nn/loss.h"
#include "nn/module.h"
#include "runtime/random.h"

namespace cohort::nn::testing {

struct GradCheckOptions {
  float h = 1e-2f;
  double tolerance = 2e-3;  // on |numeric − analytic| / max(1, |numeric|)
  bool checkInput = true;
  bool training = true;  // Pass::training of every forward (false: evaluation mode, e.g. BatchNorm)
};

inline double objective(Module& m, const Tensor& x, const Tensor& r, const Pass& pass) {
  const Tensor& y = m.forward(x, pass);
  double s = 0.0;
  for (int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(y.at(i)) * r.at(i);
  return s;
}

inline void expectClose(double numeric, double analytic, double tol, const std::string& what) {
  double err = std::fabs(numeric - analytic) / std::max(1.0, std::fabs(numeric));
  EXPECT_LT(err, tol) << what << ": numeric " << numeric << " analytic " << analytic;
}

// Checks d/d(input) and d/d(every parameter in `params`). `rngSeed` re-seeds the pass Rng before
// each forward so stochastic layers (dropout) see the same mask every time.
inline void checkModuleGradients(Module& m, ParamBuffer& params, Tensor x, const GradCheckOptions& o = {}) {
  runtime::Rng init(99);
  Shape outShape = m.outputShape(x.shape());
  Tensor r = Tensor::zeros(outShape);
  for (int64_t i = 0; i < r.numel(); ++i) r.at(i) = init.uniform(-1.0f, 1.0f);
  runtime::Rng passRng(5);
  Pass pass;
  pass.rng = &passRng;
  pass.training = o.training;
  auto eval = [&]() {
    passRng = runtime::Rng(5);
    return objective(m, x, r, pass);
  };
  eval();
  Tensor dx = m.backward(r, pass).clone();
  Tensor dp = params.bound() ? params.grads().clone() : Tensor();
  if (o.checkInput) {
    for (int64_t i = 0; i < x.numel(); ++i) {
      float saved = x.at(i);
      x.at(i) = saved + o.h;
      double up = eval();
      x.at(i) = saved - o.h;
      double down = eval();
      x.at(i) = saved;
      expectClose((up - down) / (2.0 * o.h), dx.at(i), o.tolerance, "input[" + std::to_string(i) + "]");
    }
  }
  if (!params.bound()) return;
  for (const auto& e : params.entries()) {
    for (size_t k = 0; k < e.numel; ++k) {
      float& v = params.values().at(static_cast<int64_t>(e.offset + k));
      float saved = v;
      v = saved + o.h;
      double up = eval();
      v = saved - o.h;
      double down = eval();
      v = saved;
      expectClose((up - down) / (2.0 * o.h), dp.at(static_cast<int64_t>(e.offset + k)), o.tolerance,
                  e.name + "[" + std::to_string(k) + "]");
    }
  }
}

inline void checkLossGradient(Loss& loss, Tensor out, const Tensor& targets, const GradCheckOptions& o = {}) {
  loss.forward(out, targets);
  Tensor g = loss.backward().clone();
  for (int64_t i = 0; i < out.numel(); ++i) {
    float saved = out.at(i);
    out.at(i) = saved + o.h;
    double up = loss.forward(out, targets);
    out.at(i) = saved - o.h;
    double down = loss.forward(out, targets);
    out.at(i) = saved;
    expectClose((up - down) / (2.0 * o.h), g.at(i), o.tolerance, "output[" + std::to_string(i) + "]");
  }
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
