#include "nn/sequential.h"

#include <algorithm>
#include <sstream>

#include "nn/precision.h"

namespace cohort::nn {

namespace {

// Runs `f`, a call into child `name`; its InvalidArgument is rethrown naming the child (LayerError),
// its path extended when it already names a layer further down.
template <class F>
decltype(auto) naming(const std::string& name, F&& f) {
  try {
    return f();
  } catch (const LayerError& e) {
    throw LayerError(name + "." + e.path(), e.detail());
  } catch (const InvalidArgument& e) {
    throw LayerError(name, e.what());
  }
}

}  // namespace

Sequential& Sequential::add(ModulePtr module, const std::string& name) {
  names_.push_back(name.empty() ? std::to_string(modules_.size()) : name);
  modules_.push_back(std::move(module));
  units_.emplace_back();
  return *this;
}

void Sequential::registerParams(ParamBuffer& params, const std::string& prefix) {
  entries_.clear();
  for (size_t i = 0; i < modules_.size(); ++i) {
    size_t first = params.entries().size();
    params.beginUnit(prefix + names_[i]);
    modules_[i]->registerParams(params, prefix + names_[i] + ".");
    units_[i] = params.endUnit();
    entries_.emplace_back(first, params.entries().size());
  }
}

void Sequential::resetParams(runtime::Rng& rng) {
  for (auto& m : modules_) m->resetParams(rng);
}

void Sequential::planInit(InitPlan& plan) const {
  for (size_t i = 0; i < modules_.size(); ++i) {
    const auto [first, end] = i < entries_.size() ? entries_[i] : std::pair<size_t, size_t>{0, 0};
    naming(names_[i], [&] { planChild(*modules_[i], first, end, plan); });
  }
}

Shape Sequential::outputShape(const Shape& input) const {
  Shape s = input;
  for (size_t i = 0; i < modules_.size(); ++i) s = naming(names_[i], [&] { return modules_[i]->outputShape(s); });
  return s;
}

const Tensor& Sequential::forward(const Tensor& input, const Pass& pass) {
  const Tensor* x = &input;
  inputCasts_.resize(modules_.size());
  for (size_t i = 0; i < modules_.size(); ++i) {
    Module& m = *modules_[i];
    x = &naming(names_[i], [&]() -> const Tensor& {
      return forwardOfUnit(pass, units_[i], [&]() -> const Tensor& {
        return m.forward(precision::forChild(m, *x, inputCasts_[i], pass), precision::passFor(m, pass));
      });
    });
  }
  return *x;
}

const Tensor& Sequential::backward(const Tensor& gradOutput, const Pass& pass) {
  // A module needs to pass a gradient down only when a module before it has parameters (or the
  // caller wants d(loss)/d(input)): a parameter-free prefix such as Unflatten costs nothing.
  size_t firstWithParams = 0;
  if (entries_.size() == modules_.size()) {
    while (firstWithParams < modules_.size() && entries_[firstWithParams].first == entries_[firstWithParams].second) {
      ++firstWithParams;
    }
  }
  const Tensor* g = &gradOutput;
  gradCasts_.resize(modules_.size());
  const size_t last = pass.needInputGrad ? 0 : std::min(firstWithParams, modules_.size());
  for (size_t i = modules_.size(); i-- > last;) {
    Pass p = precision::passFor(*modules_[i], pass);
    p.needInputGrad = i > firstWithParams || pass.needInputGrad;
    g = &backwardOfUnit(pass, units_[i], [&]() -> const Tensor& {
      return modules_[i]->backward(precision::forChild(*modules_[i], *g, gradCasts_[i], pass), p);
    });
  }
  if (!pass.needInputGrad && last > 0) return empty_;  // the prefix below `last` was skipped
  return modules_.empty() ? gradOutput : *g;
}

std::string Sequential::describe() const {
  std::ostringstream os;
  for (size_t i = 0; i < modules_.size(); ++i) os << names_[i] << " " << modules_[i]->name() << "\n";
  return os.str();
}

void Sequential::checkInputs(const Pass& pass) const {
  for (size_t i = 0; i < modules_.size(); ++i) naming(names_[i], [&] { modules_[i]->checkInputs(pass); });
}

}  // namespace cohort::nn
