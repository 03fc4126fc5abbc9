// Module: a layer or a composition of layers with an explicit forward and backward (no autograd
// tape; docs/architecture.md, "The decisions that shape everything", item 2). This comment is the
// contract a user's own layer implements.
//
// Lifecycle, in this order:
//   1. registerParams(params, prefix): declare each parameter with params.add(prefix + "weight",
//      shape, &weight_, &weightGrad_) (and non-trainable state with addBuffer), in forward order.
//      The prefix is what the enclosing composite chose ("fc0." inside a Sequential); a composite
//      passes prefix + childName + "." to its children. A module without parameters does nothing.
//   2. The owner binds the ParamBuffer (allocate, attach or relocate): from then on the registered
//      Tensor members view the flat value and gradient buffers; the module must not reassign them,
//      nor keep their data() pointers across calls (ParamBuffer::relocate moves the memory).
//   3. resetParams(rng): initialise the values (on the CPU, before any relocation to a GPU). A
//      module whose draws can be written down also implements nn::PlannedInit (nn/init_plan.h), as
//      every built-in layer does: then a rank of a sharded job can fill its pieces of the model alone.
//   4. forward and backward alternate: each backward() belongs to the forward() just before it, with
//      the same batch shape. forward() may be called alone (evaluation) any number of times.
// forward(input, pass) keeps what backward needs (a handle to its input or output; Tensors are
// shared handles, so that costs no copy; the caller keeps the input alive and unchanged until
// backward) and returns a reference to an output buffer the module owns.
// backward(gradOutput, pass) gets d(loss)/d(output) of the last forward and
//   - writes d(loss)/d(param) into every registered gradient Tensor, overwriting it, or adds to it
//     when Pass::accumulateGrads is set (micro-batches: the loop zeroes nothing between them);
//   - returns d(loss)/d(input), shaped like the input, in a buffer the module owns, unless
//     Pass::needInputGrad is false: then it may skip that work and return an undefined Tensor (the
//     first layer of a network never needs one).
// Buffers: output and gradient buffers are members, sized with runtime::ensureShape(buffer, shape)
// at every call, which reallocates only when a batch is larger than any before, so a steady
// training loop allocates nothing (tests/nn/hot_loop_alloc_test.cc). A returned reference stays
// valid until the module's next forward/backward. outputShape(inputShape) says what forward will
// return and throws InvalidArgument for an input the module cannot take.
// Devices: a module runs where its input lives. CPU tensors take the CPU code (plain loops,
// runtime/cpu/blas.h); CUDA tensors (parameters bound to device memory, input on the same device)
// enqueue kernels (runtime/cuda/) on Pass::gpu's stream, allocate buffers from Pass::gpu's
// allocator, and return without waiting. A layer with only a CPU path should throw
// InvalidArgument for a CUDA tensor (input.device().isCuda()) rather than read device memory.
// Element types (docs/architecture.md, "Element types"): tensors are fp32 unless a pass computes in
// bf16 (Pass::precision, GPU only). A module that implements bf16 returns true from takesBf16(): in
// a bf16 pass it takes fp32 or bf16 input and gradients, and returns bf16 or fp32 as its reader is
// best served (docs/architecture.md, "The layer contract"). A module that does not
// (every user layer unless it opts in) is only ever handed fp32: its composite converts at the
// boundary (nn/precision.h). Parameters, gradients and optimizer state are fp32 always.
// Check a layer with nn/grad_check.h (finite differences against backward).
// Units (ParamBuffer, "Units"): a composite may declare a unit around a child's registerParams
// (params.beginUnit(name) ... params.endUnit(), keeping the std::optional<ParamBuffer::Unit> it
// returns) and then tells Pass::units, when set, about it around the child's work: beforeForward
// and afterForward around its forward, beforeBackward and afterBackward around its backward
// (forwardOfUnit and backwardOfUnit below do both). afterBackward(u) means u's gradients are final
// for this pass: nothing later in the backward writes them (data-parallel training starts their
// all-reduce then, while backward goes on). A unit whose parameters a later part of the pass uses
// again (the GPT's token embedding, the tied head's weight) stays open until that use is done. Units
// nest by containment: the outermost declared unit wins, so a composite reports exactly the units
// endUnit() returned to it (none when its container declared one around it). A leaf layer declares
// and reports nothing. Each listed unit hears each event at most once per forward and per backward;
// units nobody reported (implicit units, a user's composite that declares none) count as done when
// backward returns.
// Thread safety: a module is used by one thread at a time.
//
// docs/api.md, "Writing your own layer", builds one (a learned gate) step by step, binds its
// parameters for a gradient check and trains it in a program of its own.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "nn/param_buffer.h"
#include "runtime/random.h"
#include "runtime/tensor.h"

namespace cohort::runtime::cuda {
class GpuContext;
}

namespace cohort::nn {

// Told, during a pass, as the model computes with each of its declared parameter units (above): a
// ZeRO-3 stage gathers a unit before and frees it after; GradSync starts the all-reduce of a bucket
// once afterBackward has been told for every unit in it. Each event's default does nothing.
class UnitListener {
 public:
  virtual ~UnitListener() = default;
  virtual void beforeForward(const ParamBuffer::Unit& unit) { (void)unit; }
  virtual void afterForward(const ParamBuffer::Unit& unit) { (void)unit; }
  virtual void beforeBackward(const ParamBuffer::Unit& unit) { (void)unit; }
  // The unit's gradients are final for this pass.
  virtual void afterBackward(const ParamBuffer::Unit& unit) { (void)unit; }
};

// What one forward/backward pass needs to know.
struct Pass {
  bool training = true;         // dropout active; layers keep what backward needs
  bool needInputGrad = true;    // backward must return d(loss)/d(input)
  bool accumulateGrads = false; // add to the gradient buffer instead of overwriting it
  runtime::Rng* rng = nullptr;  // dropout masks; required when training with dropout
  UnitListener* units = nullptr;  // told before and after each declared unit's forward and backward
  // The GPU a pass on CUDA tensors runs on (its compute stream, allocator and cuBLAS handle); unused
  // for CPU tensors. A module given CUDA tensors without it throws InvalidArgument.
  runtime::cuda::GpuContext* gpu = nullptr;
  // What matrix products compute in: fp32, or bf16 on tensor cores with fp32 accumulation (GPU
  // only; a CPU layer given a bf16 pass throws InvalidArgument).
  runtime::DType precision = runtime::DType::kF32;
};

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual std::string name() const = 0;
  // Declares this module's parameters as `prefix` + local name ("fc0." + "weight").
  virtual void registerParams(ParamBuffer& /*params*/, const std::string& /*prefix*/) {}
  // Initialises the registered parameters; the buffer must be bound.
  virtual void resetParams(runtime::Rng& /*rng*/) {}
  // Output shape for an input of `input` shape; throws InvalidArgument on a mismatch.
  virtual Shape outputShape(const Shape& input) const = 0;

  virtual const Tensor& forward(const Tensor& input, const Pass& pass) = 0;
  virtual const Tensor& backward(const Tensor& gradOutput, const Pass& pass) = 0;

  // True when the module implements bf16 passes (above); the composites convert for the others.
  virtual bool takesBf16() const { return false; }

  // Whether backward reads the output forward returned (an activation's derivative taken through
  // its output does). When false, a caller may write over the output once forward has returned: a
  // loss writes its gradient there (Loss::setGradInPlace), and the trainer asks. Default: true.
  virtual bool backwardReadsOutput() const { return true; }

  // Throws InvalidArgument naming the first bad value of the last forward's input that the device
  // could only count, not refuse (an Embedding's ids on a GPU, which give NaN rows there); nothing
  // for a module without such checks, and on the CPU, where forward already threw. Waits for
  // pass.gpu's stream: for where a synchronisation is acceptable (a non-finite step, evaluation).
  virtual void checkInputs(const Pass& pass) const { (void)pass; }
};

using ModulePtr = std::unique_ptr<Module>;

using UnitEvent = void (UnitListener::*)(const ParamBuffer::Unit&);

// Tells pass.units `event` (&UnitListener::beforeForward, ...) about `unit`, when both are there.
inline void tellUnit(const Pass& pass, const std::optional<ParamBuffer::Unit>& unit, UnitEvent event) {
  if (pass.units && unit) (pass.units->*event)(*unit);
}

// Runs `work` between the events `before` and `after` of `unit`; an exception skips `after`.
// Returns what `work` returns.
template <class F>
decltype(auto) betweenUnitEvents(const Pass& pass, const std::optional<ParamBuffer::Unit>& unit, UnitEvent before,
                                 UnitEvent after, F&& work) {
  tellUnit(pass, unit, before);
  decltype(auto) result = work();
  tellUnit(pass, unit, after);
  return result;
}

// A child's forward (or backward) as one unit's: betweenUnitEvents with that phase's two events.
template <class F>
decltype(auto) forwardOfUnit(const Pass& pass, const std::optional<ParamBuffer::Unit>& unit, F&& work) {
  return betweenUnitEvents(pass, unit, &UnitListener::beforeForward, &UnitListener::afterForward,
                           std::forward<F>(work));
}
template <class F>
decltype(auto) backwardOfUnit(const Pass& pass, const std::optional<ParamBuffer::Unit>& unit, F&& work) {
  return betweenUnitEvents(pass, unit, &UnitListener::beforeBackward, &UnitListener::afterBackward,
                           std::forward<F>(work));
}

}  // namespace cohort::nn
