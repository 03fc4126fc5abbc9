// Sequential: modules applied in order. Owns its modules. Parameters of module i are registered
// under "<i>.<name>" unless the module was added with a name ("fc1.weight").
// backward() runs the modules in reverse, asking the first one for no input gradient unless the
// caller's Pass asks for one. Each module with parameters is a parameter unit named like its
// parameters' prefix ("fc0", "block1" inside a nested Sequential declaring none of its own: the
// outermost unit wins, nn/param_buffer.h), and Pass::units hears before and after its forward and
// its backward (nn/module.h, "Units"). An InvalidArgument a module throws
// from forward, outputShape or checkInputs reaches the caller as a LayerError naming it by its name
// here, the one its parameters carry: "layer fc0: Linear(10 -> 16) got input of shape [32, 8]"
// ("block1.fc0" inside a nested Sequential). planInit (nn/init_plan.h) plans its modules in order;
// resetParams still calls each module's resetParams, so a user's module that draws in its own
// resetParams initialises a whole model as before, while planning a model holding it throws a
// LayerError naming it. Thread safety: as Module.
#pragma once

#include <string>
#include <vector>

#include "nn/init_plan.h"
#include "nn/module.h"
#include "runtime/error.h"

namespace cohort::nn {

// An InvalidArgument from a layer of a Sequential, naming the layer: "layer PATH: DETAIL", where PATH
// is the layer's name with those of the Sequentials around it ("block1.fc0").
class LayerError : public InvalidArgument {
 public:
  LayerError(const std::string& path, const std::string& detail)
      : InvalidArgument("layer " + path + ": " + detail), path_(path), detail_(detail) {}
  const std::string& path() const { return path_; }
  const std::string& detail() const { return detail_; }  // the layer's own message

 private:
  std::string path_, detail_;
};

class Sequential final : public Module, public PlannedInit {
 public:
  Sequential() = default;
  Sequential& add(ModulePtr module, const std::string& name = "");
  template <class M, class... Args>
  Sequential& emplace(Args&&... args) {
    return add(std::make_unique<M>(std::forward<Args>(args)...));
  }

  std::string name() const override { return "Sequential"; }
  // It converts for its children (nn/precision.h), so it takes whatever its container hands it.
  bool takesBf16() const override { return true; }
  void registerParams(ParamBuffer& params, const std::string& prefix) override;
  void resetParams(runtime::Rng& rng) override;
  void planInit(InitPlan& plan) const override;
  Shape outputShape(const Shape& input) const override;
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;
  void checkInputs(const Pass& pass) const override;  // every module's, in order

  size_t size() const { return modules_.size(); }
  Module& at(size_t i) { return *modules_.at(i); }
  // One line per module: "0 Linear(784 -> 512)", used by `cohort train` at start-up.
  std::string describe() const;

 private:
  std::vector<ModulePtr> modules_;
  std::vector<std::string> names_;
  std::vector<std::pair<size_t, size_t>> entries_;  // each module's [first, end) ParamBuffer entries
  std::vector<std::optional<ParamBuffer::Unit>> units_;  // each module's unit, if it declared one
  // A bf16 pass: fp32 copies of the inputs and gradients handed to children that take fp32 only
  // (nn/precision.h), one per child; a forward input stays alive until that child's backward.
  std::vector<Tensor> inputCasts_, gradCasts_;
  Tensor empty_;
};

}  // namespace cohort::nn
