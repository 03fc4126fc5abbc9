// Module: a layer or a composition of layers with an explicit forward and backward (no autograd
// tape; DESIGN.md §3.2).
//
// Lifecycle: registerParams() declares parameters to a ParamBuffer (in forward order), the buffer is
// bound, resetParams() initialises them (PyTorch's defaults), then forward/backward alternate.
// forward() keeps what backward() needs and returns a reference to an output buffer the module owns;
// backward() takes d(loss)/d(output) for the last forward(), writes the parameter gradients (or adds
// to them with Pass::accumulateGrads) and returns d(loss)/d(input) — or an undefined tensor when
// Pass::needInputGrad is false (the first layer never needs it). Output and gradient buffers are
// sized per batch shape and reused, so a steady training loop allocates nothing.
// Devices: a module runs where its input lives. CPU tensors take the CPU code (OpenBLAS and plain
// loops); CUDA tensors (parameters bound to device memory, input on the same device) enqueue the
// kernels of runtime/cuda/kernels.h on Pass::gpu's stream and return without waiting.
// Thread safety: a module is used by one thread at a time.
#pragma once

#include <memory>
#include <string>

#include "nn/param_buffer.h"
#include "runtime/random.h"
#include "runtime/tensor.h"

namespace cohort::runtime::cuda {
class GpuContext;
}

namespace cohort::nn {

// Told during backward which parameters' gradients are final: entries [first, end) of the model's
// ParamBuffer (GradSync starts a bucket's all-reduce as soon as all of its entries are ready).
class GradReadyListener {
 public:
  virtual ~GradReadyListener() = default;
  virtual void gradsReady(size_t firstEntry, size_t endEntry) = 0;
};

// What one forward/backward pass needs to know.
struct Pass {
  bool training = true;         // dropout active; layers keep what backward needs
  bool needInputGrad = true;    // backward must return d(loss)/d(input)
  bool accumulateGrads = false; // add to the gradient buffer instead of overwriting it
  runtime::Rng* rng = nullptr;  // dropout masks; required when training with dropout
  GradReadyListener* gradReady = nullptr;  // told as each module's gradients become final
  // The GPU a pass on CUDA tensors runs on (its compute stream, allocator and cuBLAS handle); unused
  // for CPU tensors. A module given CUDA tensors without it throws InvalidArgument.
  runtime::cuda::GpuContext* gpu = nullptr;
};

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  virtual std::string name() const = 0;
  // Declares this module's parameters as `prefix` + local name ("fc0." + "weight").
  virtual void registerParams(ParamBuffer& params, const std::string& prefix) {}
  // Initialises the registered parameters; the buffer must be bound.
  virtual void resetParams(runtime::Rng& rng) {}
  // Output shape for an input of `input` shape; throws InvalidArgument on a mismatch.
  virtual Shape outputShape(const Shape& input) const = 0;

  virtual const Tensor& forward(const Tensor& input, const Pass& pass) = 0;
  virtual const Tensor& backward(const Tensor& gradOutput, const Pass& pass) = 0;
};

using ModulePtr = std::unique_ptr<Module>;

}  // namespace cohort::nn
