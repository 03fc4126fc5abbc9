// Residual: y = x + f(x) for any Module f it owns (a skip connection around a block, as in ResNet).
// f must return its input's shape: outputShape() throws InvalidArgument naming both shapes
// otherwise (and forward() does, for an f whose output disagrees with its outputShape()).
//
// Parameters: f's are registered under prefix + name + "." (name "f" by default), so a Residual
// added to a Sequential as "res0" around a Linear owns "res0.f.weight" and "res0.f.bias"; an empty
// name registers them directly under the prefix. backward() computes dx = dy + f.backward(dy),
// passing Pass::accumulateGrads (and the rest of the Pass) on to f; with Pass::needInputGrad false
// it asks f for no input gradient either and returns an undefined Tensor. f's parameters are one
// unit, named like their prefix ("res0.f"; nn/param_buffer.h, "Units"), of which Pass::units hears
// around f's forward and backward — unless a container declared a unit around the Residual (a
// Sequential's "res0"), which then wins, so every entry is reported exactly once at any nesting.
// Buffers: the output and the input gradient are owned and sized per batch shape
// (runtime::ensureShape); nothing is allocated in steady state. Devices: on CUDA tensors the two
// additions are a device copy and an axpy on Pass::gpu's stream. Thread safety: as Module.
//
//   auto block = std::make_unique<Sequential>();
//   block->add(std::make_unique<Linear>(64, 64), "fc0").add(relu()).add(std::make_unique<Linear>(64, 64), "fc1");
//   net.add(std::make_unique<Residual>(std::move(block)), "res0");  // "res0.f.fc0.weight", ...
#pragma once

#include <string>

#include "nn/init_plan.h"
#include "nn/module.h"

namespace cohort::nn {

// out = a + b, element-wise, sized to a's shape on a's device (b has the same shape and device; on a
// GPU on Pass::gpu's stream, one kernel): the addition of a skip connection, shared with
// TransformerBlock. a and out are fp32; on a GPU b may be bf16 (a bf16 branch's output), widened.
void addInto(Tensor& out, const Tensor& a, const Tensor& b, const Pass& pass);

class Residual final : public Module, public PlannedInit {
 public:
  // Throws InvalidArgument when f is null.
  explicit Residual(ModulePtr f, std::string name = "f");

  std::string name() const override { return "Residual(" + f_->name() + ")"; }
  void registerParams(ParamBuffer& params, const std::string& prefix) override;
  void resetParams(runtime::Rng& rng) override { f_->resetParams(rng); }
  // f's plan; InvalidArgument naming f when f has parameters and cannot be planned.
  void planInit(InitPlan& plan) const override { planChild(*f_, 0, fEntries_, plan); }
  Shape outputShape(const Shape& input) const override;
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;

  Module& inner() { return *f_; }

 private:
  ModulePtr f_;
  std::string name_;
  std::optional<ParamBuffer::Unit> unit_;  // f's unit, when the Residual's is the outermost
  size_t fEntries_ = 0;                    // how many parameters f registered
  Tensor output_;
  Tensor gradInput_;
  Tensor none_;  // returned when no input gradient is asked for
};

}  // namespace cohort::nn
