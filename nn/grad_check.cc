#include "nn/grad_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "runtime/error.h"
#include "runtime/random.h"

namespace cohort::nn {
namespace {

// Failures kept word for word in the result; the rest are only counted.
constexpr size_t kMaxFailures = 8;
// What the gradient buffer holds before the checked backward: a backward that adds to its
// gradients instead of overwriting them is off by this much.
constexpr float kStaleGrad = 0.375f;
// R of the objective L = Σ output ⊙ R.
constexpr uint64_t kObjectiveSeed = 99;

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

std::string elementName(const std::string& tensor, int64_t index) { return tensor + "[" + std::to_string(index) + "]"; }

void requireCpu(const Tensor& t, const char* what) {
  if (!t.device().isCpu()) {
    COHORT_THROW(InvalidArgument) << "gradient check: " << what << " is on " << t.device().str()
                                  << "; the check runs on CPU tensors only";
  }
}

// The elements of a tensor of n to check: all, or `cap` of them spread evenly (first included).
std::vector<int64_t> elementsToCheck(int64_t n, int64_t cap) {
  std::vector<int64_t> out;
  const int64_t count = cap > 0 && cap < n ? cap : n;
  out.reserve(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) {
    out.push_back(count == n ? k : static_cast<int64_t>(static_cast<double>(k) * n / count));
  }
  return out;
}

// (f(v + h) − f(v − h)) / 2h, leaving v as it was.
template <class F>
double centralDifference(float& v, float h, F&& objective) {
  const float saved = v;
  v = saved + h;
  const double up = objective();
  v = saved - h;
  const double down = objective();
  v = saved;
  return (up - down) / (2.0 * h);
}

// How a failed comparison is worded.
struct Wording {
  const char* reference = "numeric";
  const char* actual = "analytic";
};

// Collects comparisons into a GradCheckResult.
class Recorder {
 public:
  Recorder(double tolerance, GradCheckResult& result) : tolerance_(tolerance), result_(result) {}

  // `reference` is what `actual` should be (the finite difference).
  void compare(double reference, double actual, const std::string& tensor, int64_t index, Wording wording = {}) {
    double error = std::fabs(reference - actual) / std::max(1.0, std::fabs(reference));
    if (std::isnan(error)) error = std::numeric_limits<double>::infinity();
    ++result_.checked;
    if (result_.worstWhere.empty() || error > result_.worstError) {
      result_.worstError = error;
      result_.worstWhere = elementName(tensor, index);
    }
    if (error <= tolerance_) return;
    fail(elementName(tensor, index) + ": " + wording.reference + " " + number(reference) + ", " + wording.actual + " " +
         number(actual) + " (error " + number(error) + ")");
  }

  // A failure that is not a value (a missing gradient, a wrong shape): the worst there is.
  void failAt(const std::string& where, const std::string& message) {
    result_.worstError = std::numeric_limits<double>::infinity();
    result_.worstWhere = where;
    fail(where + ": " + message);
  }

 private:
  void fail(const std::string& message) {
    result_.ok = false;
    ++result_.failed;
    if (result_.failures.size() < kMaxFailures) result_.failures.push_back(message);
  }

  double tolerance_;
  GradCheckResult& result_;
};

Tensor uniformTensor(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::zeros(shape);
  runtime::Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.at(i) = rng.uniform(-1.0f, 1.0f);
  return t;
}

// With the gradients of one backward in `grads` (and in the buffer), a second backward with
// Pass::accumulateGrads must leave twice them.
template <class F>
void checkAccumulation(Module& module, ParamBuffer& params, const Tensor& grads, const Tensor& r, Pass pass,
                       F&& objective, Recorder& rec, const GradCheckOptions& o) {
  objective();
  params.grads().copyFrom(grads);
  pass.accumulateGrads = true;
  module.backward(r, pass);
  for (const auto& e : params.entries()) {
    for (int64_t k : elementsToCheck(static_cast<int64_t>(e.numel), o.maxPerTensor)) {
      const auto at = static_cast<int64_t>(e.offset) + k;
      rec.compare(2.0 * grads.at(at), params.grads().at(at), e.name, k,
                  {.reference = "a second backward with Pass::accumulateGrads should add up to", .actual = "but left"});
    }
  }
}

}  // namespace

std::string GradCheckResult::summary() const {
  if (ok) {
    return "gradient check passed: " + std::to_string(checked) + " elements, worst error " + number(worstError) +
           (worstWhere.empty() ? "" : " at " + worstWhere);
  }
  std::string s = "gradient check failed: " + std::to_string(failed) + " failure(s) in " + std::to_string(checked) +
                  " elements, worst error " + number(worstError) + " at " + worstWhere;
  for (const auto& f : failures) s += "\n  " + f;
  if (static_cast<size_t>(failed) > failures.size()) {
    s += "\n  ... and " + std::to_string(static_cast<size_t>(failed) - failures.size()) + " more";
  }
  return s;
}

GradCheckResult checkGradients(Module& module, ParamBuffer& params, const Tensor& input,
                               const GradCheckOptions& options) {
  requireCpu(input, "the input");
  if (!params.entries().empty() && !params.bound()) {
    COHORT_THROW(InvalidArgument) << "gradient check of " << module.name() << ": its " << params.entries().size()
                                  << " registered parameters are not bound (ParamBuffer::allocate first)";
  }
  if (params.bound()) requireCpu(params.values(), "the ParamBuffer");
  GradCheckResult result;
  Recorder rec(options.tolerance, result);
  Tensor x = input.clone();
  const Tensor r = uniformTensor(module.outputShape(x.shape()), kObjectiveSeed);
  runtime::Rng passRng(options.seed);
  Pass pass;
  pass.training = options.training;
  pass.rng = &passRng;
  auto objective = [&]() {
    passRng = runtime::Rng(options.seed);
    const Tensor& y = module.forward(x, pass);
    if (y.numel() != r.numel()) {
      COHORT_THROW(InvalidArgument) << "gradient check: " << module.name() << "'s forward returned " << y.shape().str()
                                    << " where its outputShape() says " << r.shape().str();
    }
    double s = 0.0;
    for (int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(y.at(i)) * r.at(i);
    return s;
  };

  objective();
  if (params.bound()) params.grads().fill(kStaleGrad);
  const Tensor& dxOut = module.backward(r, pass);
  Tensor dx;
  if (options.checkInput) {
    if (!dxOut.defined() || dxOut.shape() != x.shape()) {
      rec.failAt("input",
                 "backward returned " +
                     (dxOut.defined() ? "a gradient of " + dxOut.shape().str() : std::string("no input gradient")) +
                     " for an input of " + x.shape().str());
    } else {
      dx = dxOut.clone();
    }
  }
  const Tensor grads = params.bound() ? params.grads().clone() : Tensor();

  if (dx.defined()) {
    for (int64_t i : elementsToCheck(x.numel(), options.maxPerTensor)) {
      rec.compare(centralDifference(x.at(i), options.h, objective), dx.at(i), "input", i);
    }
  }
  if (!params.bound()) return result;
  for (const auto& e : params.entries()) {
    for (int64_t k : elementsToCheck(static_cast<int64_t>(e.numel), options.maxPerTensor)) {
      const auto at = static_cast<int64_t>(e.offset) + k;
      rec.compare(centralDifference(params.values().at(at), options.h, objective), grads.at(at), e.name, k);
    }
  }
  if (options.checkAccumulate) checkAccumulation(module, params, grads, r, pass, objective, rec, options);
  params.grads().copyFrom(grads);
  return result;
}

GradCheckResult checkGradients(Loss& loss, const Tensor& output, const Tensor& targets,
                               const GradCheckOptions& options) {
  requireCpu(output, "the output");
  requireCpu(targets, "the targets");
  GradCheckResult result;
  Recorder rec(options.tolerance, result);
  Tensor out = output.clone();
  auto objective = [&]() { return static_cast<double>(loss.forward(out, targets)); };
  objective();
  const Tensor& gOut = loss.backward();
  if (gOut.numel() != out.numel()) {
    rec.failAt("output",
               "backward returned a gradient of " + gOut.shape().str() + " for an output of " + out.shape().str());
    return result;
  }
  const Tensor g = gOut.clone();
  for (int64_t i : elementsToCheck(out.numel(), options.maxPerTensor)) {
    rec.compare(centralDifference(out.at(i), options.h, objective), g.at(i), "output", i);
  }
  objective();  // leaves the loss's state at the unperturbed output
  return result;
}

}  // namespace cohort::nn
